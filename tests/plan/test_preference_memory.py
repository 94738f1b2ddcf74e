"""The planner's memory for preference tuning: doubled rows, and the reference model only where
one is held (full fine-tuning with sigmoid/ipo and no precomputed reference log-probs)."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from gptforge.config import FinetuneConfig, ModelConfig, TrainConfig
from gptforge.model.gpt import GPT
from gptforge.plan.finetune_memory import estimate_finetune_memory
from gptforge.plan.memory import estimate_memory

SHAPE = dict(arch="llama", n_layer=4, n_head=8, n_kv_head=4, d_model=512, d_ff=1536, block_size=512,
             vocab_size=8192)
TRAIN = TrainConfig(micro_batch_size=4, precision="bf16")


def _dpo(**kw) -> FinetuneConfig:
    return FinetuneConfig(**{"method": "full", "objective": "dpo", **kw})


def test_full_dpo_holds_a_frozen_copy_and_twice_the_rows():
    model = ModelConfig(**SHAPE)
    dpo = estimate_finetune_memory(model, TRAIN, _dpo())
    doubled = estimate_memory(model.resolved(), dataclasses.replace(TRAIN, micro_batch_size=8))
    sft = estimate_finetune_memory(model, TRAIN, FinetuneConfig(method="full"))
    ref = dpo.peak_parts["reference_weights"]
    # The copy is the policy's fp32 weights, as many bytes as a real deepcopy of the model holds.
    real = copy.deepcopy(GPT(model.resolved()))
    assert ref == dpo.weights == sum(p.numel() * p.element_size() for p in real.parameters())
    assert dpo.peak_tensor_bytes == doubled.peak_tensor_bytes + ref
    assert all(dpo.phases[k] == doubled.phases[k] + ref for k in doubled.phases)
    assert dpo.activations == 2 * sft.activations
    assert dpo.total > sft.total + ref
    assert any("DPO reference" in a for a in dpo.assumptions)


@pytest.mark.parametrize("fc", [_dpo(precompute_ref=True), _dpo(dpo_loss="simpo"), _dpo(dpo_loss="orpo"),
                                _dpo(method="lora")], ids=["precompute", "simpo", "orpo", "lora"])
def test_no_reference_copy_where_none_is_held(fc):
    model = ModelConfig(**SHAPE)
    est = estimate_finetune_memory(model, TRAIN, fc)
    base = estimate_finetune_memory(model, dataclasses.replace(TRAIN, micro_batch_size=8),
                                    dataclasses.replace(fc, objective="sft"))
    assert "reference_weights" not in est.peak_parts
    assert est.peak_tensor_bytes == base.peak_tensor_bytes and est.total == base.total


def test_plan_command_prints_the_reference_line(capsys):
    from gptforge.commands.plan import main

    args = ["--model.arch", "llama", "--model.n_layer", "2", "--model.d_model", "256", "--model.n_head", "4",
            "--model.vocab_size", "4096", "--model.block_size", "256", "--finetune.method", "full"]
    assert main(args + ["--finetune.objective", "dpo"]) == 0
    out = capsys.readouterr().out
    assert "DPO reference model (frozen copy)" in out and "counts pairs" in out
    assert main(args + ["--finetune.objective", "dpo", "--finetune.precompute_ref", "true"]) == 0
    assert "DPO reference model" not in capsys.readouterr().out
