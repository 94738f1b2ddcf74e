"""Parameter counts, FLOPs per token, MFU and GPU-hours against published figures."""

import pytest
import torch

from gptforge.config import ModelConfig
from gptforge.model.gpt import GPT
from gptforge.plan.flops import chinchilla_tokens, flops_per_token, gpu_hours, mfu
from gptforge.plan.hardware import get_gpu
from gptforge.plan.params import param_count, param_shapes
from gptforge.presets import PRESETS


@pytest.mark.parametrize("preset,expected", [
    ("gpt2-small", 124_439_808),
    ("gpt2-medium", 354_823_168),
    ("gpt2-large", 774_030_080),
    ("gpt2-xl", 1_557_611_200),
    ("llama-2-7b", 6_738_415_616),
    ("llama-3-8b", 8_030_261_248),
])
def test_param_counts_match_published(preset, expected):
    assert param_count(ModelConfig(preset=preset)) == expected


@pytest.mark.parametrize("preset", [p for p in PRESETS if "70b" not in p and "13b" not in p])
def test_param_shapes_mirror_the_module(preset):
    # Built on the meta device: shapes without memory. Tied embeddings are listed once.
    cfg = ModelConfig(preset=preset, vocab_size=PRESETS[preset].get("vocab_size", 1000)).resolved()
    with torch.device("meta"):
        model = GPT(cfg)
    seen, actual = set(), {}
    for name, p in model.named_parameters():
        if id(p) not in seen:
            seen.add(id(p))
            actual[name] = tuple(p.shape)
    assert {p.name: p.shape for p in param_shapes(cfg)} == actual
    assert param_count(cfg) == model.num_params()


def test_variants_count_like_the_module():
    for kw in (dict(preset="gpt2-nano", bias=False, vocab_size=300), dict(preset="llama-nano", tie_embeddings=True,
               vocab_size=300, qkv_bias=True), dict(preset="gpt2-nano", tie_embeddings=False, vocab_size=300)):
        cfg = ModelConfig(**kw).resolved()
        with torch.device("meta"):
            assert param_count(cfg) == GPT(cfg).num_params()


def test_mfu_llama3_8b_h100():
    # Llama 3 8B at sequence 8192, 5,762 tokens/s per H100 (989.4 dense bf16 TFLOP/s) -> ~35.6%.
    cfg = ModelConfig(preset="llama-3-8b").resolved()
    f = flops_per_token(cfg, param_count(cfg), seq_len=8192)
    assert f == pytest.approx(6 * 8_030_261_248 + 12 * 32 * 32 * 128 * 8192)
    value = mfu(5762, f, get_gpu("h100-sxm").peak_flops("bf16"))
    assert value == pytest.approx(0.356, abs=0.001)


def test_llama2_7b_gpu_hours_both_conventions():
    # Llama 2 paper: 7B on 2T tokens took 184,320 A100 GPU-hours, consistent with 6N FLOPs/token at
    # ~39.06% MFU of 312 TFLOP/s. The attention term at sequence 4096 raises it to ~214,000.
    cfg = ModelConfig(preset="llama-2-7b").resolved()
    n = param_count(cfg)
    peak = get_gpu("a100-80g").peak_flops("bf16")
    six_n = gpu_hours(2e12, flops_per_token(cfg, n, convention="6N"), peak, 0.3906)
    full = gpu_hours(2e12, flops_per_token(cfg, n, seq_len=4096), peak, 0.3906)
    assert six_n == pytest.approx(184_000, rel=0.01)
    assert full == pytest.approx(214_000, rel=0.01)
    assert full > six_n


def test_flops_convention_is_checked():
    cfg = ModelConfig(preset="gpt2-small").resolved()
    with pytest.raises(ValueError, match="convention"):
        flops_per_token(cfg, 1, convention="8N")


def test_chinchilla_default_budget():
    assert chinchilla_tokens(1_000_000_000) == 20_000_000_000
