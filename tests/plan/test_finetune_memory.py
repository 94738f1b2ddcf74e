"""The planner's LoRA / QLoRA model states against a real fine-tuning step on the CPU."""

from __future__ import annotations

import pytest
import torch

from gptforge.config import FinetuneConfig, ModelConfig, TrainConfig
from gptforge.model.gpt import GPT
from gptforge.plan.finetune_memory import estimate_finetune_memory, finetune_states
from gptforge.plan.memory import estimate_memory
from gptforge.train.optim import build_optimizer
from gptforge.train.workflows.finetune import prepare_model

SHAPE = dict(arch="llama", n_layer=2, n_head=4, n_kv_head=2, d_model=128, d_ff=384, block_size=64, vocab_size=512)


def _measured_states(method: str, targets: list[str]) -> tuple[dict, FinetuneConfig]:
    torch.manual_seed(0)
    cfg = ModelConfig(**SHAPE).resolved()
    fc = FinetuneConfig(method=method, lora_rank=8, lora_target_modules=targets)
    model = GPT(cfg)
    prepare_model(model, fc, "cpu", "fp32")
    opt = build_optimizer(model, TrainConfig(lr=1e-3), "cpu")
    x = torch.randint(0, cfg.vocab_size, (2, 64))
    model(x).float().logsumexp(-1).mean().backward()
    opt.step()
    skip = {"rope_cos", "rope_sin"}  # position tables: the planner counts them with activations
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    weights += sum(b.numel() * b.element_size() for n, b in model.named_buffers() if n.split(".")[-1] not in skip)
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    states = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                 if torch.is_tensor(t) and t.dim() > 0)
    return {"weights": weights, "gradients": grads, "optimizer_states": states}, fc


@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], ["all"]])
def test_lora_states_match_a_real_step(targets):
    measured, fc = _measured_states("lora", targets)
    predicted = finetune_states(ModelConfig(**SHAPE), fc)
    for k in ("weights", "gradients", "optimizer_states"):
        assert predicted[k] == pytest.approx(measured[k], rel=0.10), k


def test_qlora_states_match_a_real_step():
    pytest.importorskip("bitsandbytes")
    measured, fc = _measured_states("qlora", ["all"])
    predicted = finetune_states(ModelConfig(**SHAPE), fc)
    for k in ("weights", "gradients", "optimizer_states"):
        assert predicted[k] == pytest.approx(measured[k], rel=0.10), k
    full = estimate_memory(ModelConfig(**SHAPE).resolved(), TrainConfig())
    assert predicted["weights"] < 0.5 * full.weights  # the 4-bit base is the point


def test_lora_peak_is_below_full_training_of_a_large_model():
    mc = ModelConfig(preset="llama-2-7b")
    tc = TrainConfig(micro_batch_size=1, precision="bf16", activation_checkpointing="full")
    full = estimate_finetune_memory(mc, tc, FinetuneConfig(method="full"))
    lora = estimate_finetune_memory(mc, tc, FinetuneConfig(method="lora"))
    qlora = estimate_finetune_memory(mc, tc, FinetuneConfig(method="qlora"))
    assert qlora.peak_tensor_bytes < lora.peak_tensor_bytes < full.peak_tensor_bytes
    assert qlora.weights < 0.2 * full.weights  # 4-bit blocks, fp32 embeddings and head


def test_plan_cli_prints_qlora_memory_and_the_changes_that_would_fit(capsys):
    from gptforge.cli import main

    assert main(["plan", "--model", "llama-2-7b", "--gpu", "4090", "--train.micro_batch_size", "1",
                 "--train.activation_checkpointing", "full", "--finetune.method", "qlora"]) == 0
    out = capsys.readouterr().out
    assert "FITS in 24 GiB" in out and "DOES NOT FIT" not in out and "stored in 4 bits" in out
    assert main(["plan", "--model", "gpt2-small", "--gpu", "t4", "--train.precision", "fp16",
                 "--train.micro_batch_size", "32"]) == 0
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "changes predicted to fit" in out
    assert "--train.micro_batch_size 8 --train.gradient_accumulation_steps 4" in out
