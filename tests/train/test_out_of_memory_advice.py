"""Out of memory: the error gives the planner's predicted peak beside the measured one and lists
changes that fit."""

from __future__ import annotations

import pytest
import torch

from gptforge.cli import main as cli
from gptforge.config import ModelConfig, ParallelConfig, RunConfig, TrainConfig
from gptforge.errors import TrainingError
from gptforge.plan.advice import fit_changes, out_of_memory_message

TINY = ["--model.preset", "gpt2-nano", "--model.d_model", "32", "--model.block_size", "32",
        "--train.max_steps", "4", "--train.micro_batch_size", "2", "--train.eval_interval", "0",
        "--train.warmup_steps", "1", "--train.checkpoint_interval", "2", "--train.tensorboard", "false",
        "--train.seed", "3", "--quiet"]


def test_out_of_memory_advice_lists_changes_that_fit():
    mc = ModelConfig(preset="gpt2-small", vocab_size=50257).resolved()
    tc = TrainConfig(micro_batch_size=16, gradient_accumulation_steps=1, precision="bf16")
    pc = ParallelConfig(dp_replicate=8, dp_shard=1)
    fixes = fit_changes(mc, tc, pc, capacity_bytes=12 * 2**30)
    assert fixes, "a 12 GiB device fits gpt2-small with smaller micro-batches or checkpointing"
    assert all(b <= 12 * 2**30 for _, b in fixes)
    msg = out_of_memory_message(mc, tc, pc, 12 * 2**30, 11 * 2**30)
    assert "planner predicted a peak of" in msg and "measured peak 11.00 GiB" in msg
    assert "--train.micro_batch_size 8 --train.gradient_accumulation_steps 2" in msg


def test_a_simulated_out_of_memory_error_prints_the_planners_view(tiny_shards, tmp_path, monkeypatch, capsys):
    import gptforge.train.trainer as trainer_mod

    def oom(self, step, stop):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", oom)
    with pytest.raises(TrainingError, match="planner predicted a peak of"):
        from gptforge.train.run import train

        train(RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32),
                        train=TrainConfig(max_steps=2, micro_batch_size=2, eval_interval=0, tensorboard=False)),
              tiny_shards, tmp_path / "run", progress=False)
    capsys.readouterr()
    assert cli(["pretrain", "--data", str(tiny_shards), "--out", str(tmp_path / "run2"), *TINY]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gptforge pretrain: error: out of memory: the planner predicted")

