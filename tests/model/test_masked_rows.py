"""Fully masked (padding) rows give finite outputs on every attention path (issue 15 item 7)."""

from __future__ import annotations

import pytest
import torch

from gptforge.config import ModelConfig
from gptforge.model import GPT


def _pair(arch):
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, n_layer=2, n_head=4, n_kv_head=2 if arch == "llama" else 4, d_model=32,
                      block_size=32, vocab_size=97).resolved()
    sdpa = GPT(cfg).eval()
    eager = GPT(ModelConfig(**{**cfg.__dict__, "attention": "eager"})).eval()
    eager.load_state_dict(sdpa.state_dict())
    return sdpa, eager


def _left_padded_mask(T, pads):
    """(B, 1, T, T) causal mask where sequence b's first pads[b] positions are padding."""
    B = len(pads)
    real = torch.ones(B, T, dtype=torch.bool)
    for b, n in enumerate(pads):
        real[b, :n] = False
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return (causal[None] & real[:, None, :] & real[:, :, None])[:, None]


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_padding_rows_are_finite_and_do_not_touch_real_tokens(arch):
    sdpa, eager = _pair(arch)
    T, pads = 12, [4, 0]
    x = torch.randint(0, 97, (2, T))
    mask = _left_padded_mask(T, pads)
    for model in (sdpa, eager):
        out = model(x, attn_mask=mask)
        assert torch.isfinite(out).all(), model.config.attention
    # the real tokens of the padded sequence do not depend on what the padding holds
    x2 = x.clone()
    x2[0, :4] = (x2[0, :4] + 7) % 97
    a, b = eager(x, attn_mask=mask), eager(x2, attn_mask=mask)
    torch.testing.assert_close(a[0, 4:], b[0, 4:])
    torch.testing.assert_close(a[:, :], sdpa(x, attn_mask=mask), rtol=1e-5, atol=1e-5)


def test_eager_gradients_stay_finite_with_padding():
    _, eager = _pair("llama")
    eager.train()
    x = torch.randint(0, 97, (2, 10))
    out = eager(x, attn_mask=_left_padded_mask(10, [3, 0]))
    out[:, 3:].sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in eager.parameters() if p.grad is not None)
