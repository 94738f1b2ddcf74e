import pytest
import torch

from gptforge.config import ModelConfig
from gptforge.infer.generate import filter_logits, generate
from gptforge.model import GPT


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_greedy_with_cache_equals_without(arch):
    torch.manual_seed(1)
    cfg = ModelConfig(arch=arch, n_layer=2, n_head=4, n_kv_head=2 if arch == "llama" else 4, d_model=64,
                      block_size=48, vocab_size=211).resolved()
    m = GPT(cfg)
    prompt = torch.randint(0, 211, (2, 7))
    a = generate(m, prompt, 40, temperature=0, use_cache=True)
    b = generate(m, prompt, 40, temperature=0, use_cache=False)
    assert a.shape == (2, 47)
    assert torch.equal(a, b)
    assert torch.equal(a[:, :7], prompt)


def test_generation_runs_past_block_size_and_is_seeded():
    torch.manual_seed(2)
    m = GPT(ModelConfig(n_layer=1, n_head=2, d_model=16, block_size=16, vocab_size=50).resolved())
    p = torch.zeros(1, 3, dtype=torch.long)
    a = generate(m, p, 40, temperature=1.0, top_k=10, seed=5)
    b = generate(m, p, 40, temperature=1.0, top_k=10, seed=5)
    c = generate(m, p, 40, temperature=1.0, top_k=10, seed=6)
    assert a.shape == (1, 43) and torch.equal(a, b) and not torch.equal(a, c)


def test_top_k_and_top_p_filters():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    k = filter_logits(logits, top_k=2)
    assert torch.isinf(k[0, 2:]).all() and torch.isfinite(k[0, :2]).all()
    p = filter_logits(logits, top_p=0.7)  # 0.5 + 0.3 reach 0.7: keep two
    assert torch.isfinite(p[0, :2]).all() and torch.isinf(p[0, 2:]).all()
    p1 = filter_logits(logits, top_p=0.4)  # the top token alone already exceeds 0.4
    assert torch.isfinite(p1[0, 0]) and torch.isinf(p1[0, 1:]).all()



def test_a_subnormal_temperature_is_greedy_and_a_tiny_top_p_keeps_the_top_token():
    torch.manual_seed(2)
    m = GPT(ModelConfig(n_layer=1, n_head=2, d_model=16, block_size=16, vocab_size=50).resolved())
    p = torch.zeros(1, 3, dtype=torch.long)
    greedy = generate(m, p, 6, temperature=0)
    assert torch.equal(generate(m, p, 6, temperature=1e-320, seed=1), greedy)  # was NaN probabilities
    assert torch.equal(generate(m, p, 6, temperature=1.0, top_p=1e-50, seed=1), greedy)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isfinite(filter_logits(logits, top_p=1e-50)[0, 0])

def test_eos_stops_generation():
    torch.manual_seed(3)
    m = GPT(ModelConfig(n_layer=1, n_head=2, d_model=16, block_size=32, vocab_size=20).resolved())
    p = torch.zeros(1, 2, dtype=torch.long)
    greedy = generate(m, p, 10, temperature=0)
    eos = int(greedy[0, 2])  # make the first generated token the EOS
    out = generate(m, p, 10, temperature=0, eos_id=eos)
    assert out.shape == (1, 3)


def _last_logits(model, fn):
    """Run fn() and return the last-position logits (B, V) of every forward pass of `model`."""
    seen = []
    handle = model.register_forward_hook(lambda _m, _i, out: seen.append(out[:, -1].clone()))
    try:
        fn()
    finally:
        handle.remove()
    return seen


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_past_the_context_cache_and_no_cache_follow_one_rule(arch):
    # Issue 15 item 6: the cache path re-prefilled block/2 tokens, the no-cache path cropped to
    # block, so their logits differed past the context although the tokens may agree.
    torch.manual_seed(4)
    m = GPT(ModelConfig(arch=arch, n_layer=2, n_head=2, d_model=32, block_size=16, vocab_size=64).resolved())
    p = torch.randint(0, 64, (2, 5))
    a = _last_logits(m, lambda: generate(m, p, 40, temperature=0, use_cache=True))
    b = _last_logits(m, lambda: generate(m, p, 40, temperature=0, use_cache=False))
    assert len(a) == len(b) == 40
    worst = max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))
    assert worst < 1e-4, worst


def test_a_prompt_longer_than_the_context_is_cut_with_a_warning():
    torch.manual_seed(5)
    m = GPT(ModelConfig(n_layer=1, n_head=2, d_model=16, block_size=16, vocab_size=50).resolved())
    p = torch.randint(0, 50, (1, 20))
    with pytest.warns(UserWarning, match="20 tokens is longer than the model's context of 16 tokens"):
        out = generate(m, p, 3, temperature=0, use_cache=True)
    # The cut prompt is its last 16 tokens: the same continuation as giving those alone.
    assert torch.equal(out[:, 20:], generate(m, p[:, 4:], 3, temperature=0)[:, 16:])


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("use_cache", [True, False])
def test_left_padded_batch_equals_each_row_alone(arch, use_cache):
    from gptforge.infer.generate import generate_batch

    torch.manual_seed(6)
    cfg = ModelConfig(arch=arch, n_layer=2, n_head=4, n_kv_head=2 if arch == "llama" else 4, d_model=32,
                      block_size=24, vocab_size=97, attention="eager" if use_cache else "sdpa").resolved()
    m = GPT(cfg)
    prompts = [torch.randint(0, 97, (n,)).tolist() for n in (3, 11, 7, 1)]
    batched = _last_logits(m, lambda: generate_batch(m, prompts, 30, temperature=0, use_cache=use_cache))
    for b, p in enumerate(prompts):
        alone = _last_logits(m, lambda p=p: generate_batch(m, [p], 30, temperature=0, use_cache=use_cache))
        # Every step, including those after the longest row slid its window past the context.
        assert len(alone) == len(batched) == 30
        worst = max(float((x[0] - y[b]).abs().max()) for x, y in zip(alone, batched, strict=True))
        assert worst < 1e-4, (b, worst)
        assert torch.isfinite(torch.stack([y[b] for y in batched])).all()


def test_stop_strings_and_eos_end_rows_separately():
    from gptforge.infer.generate import generate_batch

    torch.manual_seed(7)
    m = GPT(ModelConfig(n_layer=1, n_head=2, d_model=16, block_size=32, vocab_size=26).resolved())

    def decode(ids):
        return "".join(chr(97 + i) for i in ids)

    free = generate_batch(m, [[1, 2], [3]], 12, temperature=0, decode=decode)
    assert all(r.finish_reason == "length" and len(r.tokens) == 12 for r in free)
    text0 = free[0].text
    stop = text0[4:6]  # a two-character stop string that first completes at some token of row 0
    res = generate_batch(m, [[1, 2], [3]], 12, temperature=0, stop=[stop], decode=decode)
    cut = text0.find(stop)
    assert res[0].finish_reason == "stop" and res[0].text == text0[:cut]
    assert res[0].tokens == free[0].tokens[: cut + len(stop)]
    eos = free[1].tokens[2]
    res = generate_batch(m, [[1, 2], [3]], 12, temperature=0, eos_id=eos)
    first = free[1].tokens.index(eos)
    assert res[1].finish_reason == "stop" and res[1].tokens == free[1].tokens[: first + 1]
    assert res[0].tokens == free[0].tokens[: len(res[0].tokens)]
