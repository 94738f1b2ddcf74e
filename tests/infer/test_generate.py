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


def test_eos_stops_generation():
    torch.manual_seed(3)
    m = GPT(ModelConfig(n_layer=1, n_head=2, d_model=16, block_size=32, vocab_size=20).resolved())
    p = torch.zeros(1, 2, dtype=torch.long)
    greedy = generate(m, p, 10, temperature=0)
    eos = int(greedy[0, 2])  # make the first generated token the EOS
    out = generate(m, p, 10, temperature=0, eos_id=eos)
    assert out.shape == (1, 3)
