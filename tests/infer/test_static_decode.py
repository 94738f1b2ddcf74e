"""The static-shape decode step: full-length cache with a mask, compiled once per shape bucket."""

import pytest
import torch

from gptforge.config import ModelConfig
from gptforge.infer.generate import generate, generate_batch
from gptforge.infer.static_decode import StaticDecoder, bucket_length, static_decoder
from gptforge.model import GPT
from gptforge.train.compile_choice import cpp_compiler

needs_compiler = pytest.mark.skipif(cpp_compiler() is None,
                                    reason="Inductor's CPU backend needs a C++ compiler (c++, g++, clang++)")


def _model(arch: str, dtype=torch.float32, block_size: int = 40, n_layer: int = 1) -> GPT:
    # One layer where a test compiles (compile time grows with the layers); two where it does not.
    torch.manual_seed(3)
    cfg = ModelConfig(arch=arch, n_layer=n_layer, n_head=2, n_kv_head=1 if arch == "llama" else 2, d_model=32,
                      block_size=block_size, vocab_size=97).resolved()
    m = GPT(cfg).eval()
    # A trained-like margin: scale the head so greedy choices are not near-ties under rounding.
    with torch.no_grad():
        m.lm_head.weight.mul_(8)
    return m.to(dtype)


def test_bucket_length_is_a_power_of_two_capped_at_the_block():
    assert [bucket_length(n, 1024) for n in (1, 16, 17, 100, 600, 1024)] == [16, 16, 32, 128, 1024, 1024]
    assert bucket_length(33, 40) == 40
    with pytest.raises(ValueError, match="block_size 40"):
        bucket_length(41, 40)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_uncompiled_static_step_gives_eager_greedy_tokens_with_left_padding(arch, dtype):
    # The step's logic (mask over unfilled and padding keys, positions from the index) run eagerly:
    # fast, and the compiled step runs the same function.
    m = _model(arch, dtype, n_layer=2)
    prompts = [[5, 9, 2, 7, 1, 3], [4, 8]]
    eager = generate_batch(m, prompts, 10, temperature=0)
    dec = StaticDecoder(m, 2, 32)
    dec._compiled = dec._step  # no compile
    from gptforge.infer.generate import padded_batch

    idx, pos, mask, pads = padded_batch(prompts, "cpu")
    with torch.no_grad():
        logits = dec.prefill(idx, pos, mask, pads)
        out = [[], []]
        for _ in range(10):
            nxt = logits.argmax(-1, keepdim=True)
            for b in range(2):
                out[b].append(int(nxt[b]))
            logits = dec.step(nxt)
    assert out == [g.tokens for g in eager]
    assert int(dec.index) == 6 + 10 and dec.filled == 16


def test_static_step_refuses_a_full_cache():
    m = _model("gpt2")
    dec = StaticDecoder(m, 1, 16)
    dec._compiled = dec._step
    with torch.no_grad():
        with pytest.raises(ValueError, match="17 tokens does not fit"):
            dec.prefill(torch.zeros(1, 17, dtype=torch.long), None, None, [0])
        logits = dec.prefill(torch.zeros(1, 15, dtype=torch.long), None, None, [0])
        dec.step(logits.argmax(-1, keepdim=True))
        with pytest.raises(ValueError, match="16 positions is full"):
            dec.step(logits.argmax(-1, keepdim=True))


@needs_compiler
def test_compiled_generate_equals_eager_llama_batch_with_padding_and_past_the_block():
    m = _model("llama", block_size=24)
    prompts = [[5, 9, 2, 7, 1, 3, 11], [4, 8, 6]]
    # 30 new tokens: past block_size 24, so the window slides and the static cache is re-prefilled.
    eager = generate_batch(m, prompts, 30, temperature=0)
    compiled = generate_batch(m, prompts, 30, temperature=0, compile=True)
    assert [g.tokens for g in compiled] == [g.tokens for g in eager]
    assert static_decoder(m, 2, 24) is static_decoder(m, 2, 24)  # built once per shape
    assert not any("_orig_mod" in k for k in m.state_dict())  # the decoder is not a submodule


@needs_compiler
def test_compiled_generate_equals_eager_gpt2_bf16_and_reuses_the_graph():
    m = _model("gpt2", torch.bfloat16)
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    eager = generate(m, prompt, 12, temperature=0)
    assert torch.equal(generate(m, prompt, 12, temperature=0, compile=True), eager)
    # Another prompt in the same bucket (5 + 12 - 1 -> 16): the same decoder, no new graph.
    dec = static_decoder(m, 1, 16)
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    other = torch.tensor([[7, 7, 2, 9]])
    assert torch.equal(generate(m, other, 12, temperature=0, compile=True), generate(m, other, 12, temperature=0))
    assert static_decoder(m, 1, 16) is dec
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames


def test_compile_without_the_cache_is_refused():
    with pytest.raises(ValueError, match="compile needs the KV cache"):
        generate_batch(_model("gpt2"), [[1, 2]], 3, temperature=0, use_cache=False, compile=True)


@needs_compiler
def test_a_graph_break_falls_back_to_a_compile_with_breaks():
    m = _model("gpt2")
    norm = m.norm_f.forward

    def broken(x):
        torch._dynamo.graph_break()  # what an untraceable layer does to a fullgraph compile
        return norm(x)

    m.norm_f.forward = broken
    prompt = torch.tensor([[2, 7, 1, 8]])
    assert torch.equal(generate(m, prompt, 6, temperature=0, compile=True), generate(m, prompt, 6, temperature=0))
    assert static_decoder(m, 1, 16).fullgraph is False


@needs_compiler
def test_generate_command_with_compile_prints_eager_text(trained_run, capsys):
    from gptforge.cli import main

    args = ["generate", str(trained_run), "--prompt", "def f(", "--max-new-tokens", "8", "--temperature", "0",
            "--device", "cpu"]
    assert main(args) == 0
    eager = capsys.readouterr().out
    assert main(args + ["--compile"]) == 0
    assert capsys.readouterr().out == eager
    assert main(args + ["--compile", "--no-cache"]) != 0
    assert "compile needs the KV cache" in capsys.readouterr().err


@needs_compiler
def test_decoders_past_dynamos_recompile_limit_each_keep_their_one_graph():
    m = _model("llama")
    with torch._dynamo.config.patch(recompile_limit=1):
        for length in (16, 32):  # two decoders, two graphs of the same `_step` code
            dec = static_decoder(m, 1, length)
            with torch.no_grad():
                logits = dec.prefill(torch.tensor([[1, 2, 3]]), None, None, [0])
                dec.step(logits.argmax(-1, keepdim=True))
            assert dec.fullgraph  # no FailOnRecompileLimitHit, so no fallback


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_generate_batch_through_uncompiled_static_steps_equals_eager(arch, monkeypatch):
    # generate_batch's use of the decoder (buckets, re-prefill past the block, a prompt of exactly
    # block_size tokens, padding, seeded sampling) with the step run eagerly: no compile needed.
    monkeypatch.setattr(StaticDecoder, "_compile", lambda self: self._step)
    m = _model(arch, block_size=24, n_layer=2)
    cases = [([[5, 9, 2, 7, 1, 3, 11], [4, 8, 6]], 30, {}), ([list(range(1, 25))], 5, {}),
             ([[3, 1, 4], [1, 5]], 12, {"temperature": 0.9, "top_k": 20, "seed": 4})]
    for prompts, n, kw in cases:
        kw = kw or {"temperature": 0}
        eager = generate_batch(m, prompts, n, **kw)
        static = generate_batch(m, prompts, n, compile=True, **kw)
        assert [g.tokens for g in static] == [g.tokens for g in eager], (prompts, n, kw)


def test_row_matvec_passes_eager_calls_through():
    from gptforge.infer.static_decode import RowMatvec

    x, w, b = torch.randn(1, 8), torch.randn(5, 8), torch.randn(5)
    with RowMatvec():
        y = torch.nn.functional.linear(x, w, b)
    assert torch.equal(y, torch.nn.functional.linear(x, w, b))


@needs_compiler
@pytest.mark.parametrize("rows", [1, 2, 3])
def test_row_matvec_traces_one_or_two_rows_as_a_reduction(rows):
    from torch._inductor.utils import run_and_get_code

    from gptforge.infer.static_decode import RowMatvec

    torch._dynamo.reset()
    x, w, b = torch.randn(rows, 1, 16), torch.randn(24, 16), torch.randn(24)

    def f(x, w, b):
        with RowMatvec():
            return torch.nn.functional.linear(x, w, b)

    y, (code, *_) = run_and_get_code(torch.compile(f, fullgraph=True, dynamic=False), x, w, b)
    assert y.shape == (rows, 1, 24)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)
    calls_blas = "addmm" in code or "mm(" in code
    assert calls_blas == (rows > 2), code[-1500:]
