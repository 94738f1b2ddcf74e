"""Values the trainer cannot train with (planner-only optimizers and precisions, out-of-range
numbers) are refused before the run directory is made."""

from __future__ import annotations

import pytest

from gptforge.cli import main as cli

TINY = ["--model.preset", "gpt2-nano", "--model.d_model", "32", "--model.block_size", "32",
        "--train.max_steps", "4", "--train.micro_batch_size", "2", "--train.eval_interval", "0",
        "--train.warmup_steps", "1", "--train.checkpoint_interval", "2", "--train.tensorboard", "false",
        "--train.seed", "3", "--quiet"]


@pytest.mark.parametrize("flag,value", [("--train.optimizer", "adafactor"), ("--train.optimizer", "adamw8bit"),
                                        ("--train.precision", "fp8"), ("--train.warmup_steps", "-5"),
                                        ("--train.micro_batch_size", "0"), ("--train.max_steps", "0")])
def test_untrainable_values_are_refused_before_anything_starts(flag, value, tiny_shards, tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(["pretrain", "--data", str(tiny_shards), "--out", str(run), *TINY, flag, value]) == 2  # a bad option: errors.USAGE_EXIT
    err = capsys.readouterr().err
    assert f"train.{flag.split('.')[1]}" in err and ("plan" in err or "must be" in err)
    assert not run.exists()  # refused before the run directory was made

