"""The fused q/k/v matmul of training: eager's logits and gradients, and the unfused route wherever
the projections are not plain nn.Linear layers (LoRA, pruning masks) or gradients are off."""

import pytest
import torch
import torch.nn as nn
from torch.nn.utils import prune

from gptforge.config import ModelConfig
from gptforge.model.gpt import GPT, Attention
from gptforge.model.lora import LoRAConfig, apply_lora


def _cfg(**kw):
    base = dict(preset="gpt2-nano", block_size=16, vocab_size=50, dropout=0.0)
    return ModelConfig(**{**base, **kw}).resolved()


def _unfused(monkeypatch):
    monkeypatch.setattr(Attention, "fuses_qkv", lambda self: False)


@pytest.mark.parametrize("kw", [dict(), dict(arch="llama", n_kv_head=2, qkv_bias=True)],
                         ids=["gpt2", "llama-gqa-bias"])
def test_fused_gives_unfused_logits_and_gradients(monkeypatch, kw):
    torch.manual_seed(0)
    cfg = _cfg(**kw)
    model = GPT(cfg)
    if cfg.qkv_bias:  # biases start at zero: make them matter
        for b in model.blocks:
            for m in (b.attn.q_proj, b.attn.k_proj, b.attn.v_proj):
                nn.init.normal_(m.bias)
    idx = torch.randint(0, 50, (3, 16))
    assert all(b.attn.fuses_qkv() for b in model.blocks)

    def run():
        model.zero_grad(set_to_none=True)
        logits = model(idx)
        logits.float().logsumexp(-1).mean().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    fused_logits, fused_grads = run()
    with monkeypatch.context() as m:
        _unfused(m)
        plain_logits, plain_grads = run()
    torch.testing.assert_close(fused_logits, plain_logits, rtol=1e-5, atol=1e-5)
    for name, g in plain_grads.items():
        torch.testing.assert_close(fused_grads[name], g, rtol=1e-4, atol=1e-6, msg=name)
    # The parameters and their names are the unfused model's: nothing new in the state dict.
    assert not any("qkv" in k for k in model.state_dict())


def test_fused_under_bf16_autocast_matches_unfused(monkeypatch):
    torch.manual_seed(0)
    model = GPT(_cfg())
    idx = torch.randint(0, 50, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = model(idx).float()
        with monkeypatch.context() as m:
            _unfused(m)
            plain = model(idx).float()
    torch.testing.assert_close(fused, plain, rtol=2e-2, atol=2e-2)


def test_unfused_without_gradients_lora_or_pruning():
    torch.manual_seed(0)
    model = GPT(_cfg())
    attn = model.blocks[0].attn
    with torch.no_grad():  # inference (decoding): no weight copy per token
        assert not attn.fuses_qkv()
    assert attn.fuses_qkv()
    lora = GPT(_cfg())
    apply_lora(lora, LoRAConfig(rank=2, target_modules=["q_proj", "v_proj"]))
    assert not any(b.attn.fuses_qkv() for b in lora.blocks)
    lora(torch.randint(0, 50, (1, 16))).sum().backward()  # LoRA's own layers run, adapters get gradients
    assert all(p.grad is not None for n, p in lora.named_parameters() if p.requires_grad)
    pruned = GPT(_cfg())
    prune.l1_unstructured(pruned.blocks[0].attn.k_proj, "weight", amount=0.5)  # weight = weight_orig * mask
    assert not pruned.blocks[0].attn.fuses_qkv() and pruned.blocks[1].attn.fuses_qkv()


def test_bf16_training_attends_in_fp32_outside_autocast(monkeypatch):
    """CPU autocast casts scaled_dot_product_attention's inputs to bf16: the training path leaves
    autocast so that the fp32 upcast is what the kernel sees; decoding attends in bf16."""
    import torch.nn.functional as F

    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((q.dtype, torch.is_autocast_enabled("cpu")))
        return real(q, k, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    torch.manual_seed(0)
    model = GPT(_cfg())
    idx = torch.randint(0, 50, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(idx)
    assert seen and all(s == (torch.float32, False) for s in seen)
    assert logits.dtype == torch.bfloat16
    logits.float().sum().backward()
    seen.clear()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(idx)
    assert seen and all(s == (torch.bfloat16, True) for s in seen)
