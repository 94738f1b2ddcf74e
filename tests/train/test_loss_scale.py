"""Under fp16 the loss scale of every step is logged (metrics.jsonl `loss_scale`)."""

import pytest
import torch

import gptforge.train.objectives.next_token as next_token_lib
import gptforge.train.run as loop
from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.train.loggers import read_metrics


def _cfg(precision: str) -> RunConfig:
    return RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32),
                     train=TrainConfig(max_steps=4, micro_batch_size=2, lr=1e-3, warmup_steps=1, eval_interval=0,
                                       checkpoint_interval=0, tensorboard=False, precision=precision,
                                       max_bad_steps=3))


def test_fp16_logs_the_loss_scale_of_every_step_and_halves_it_after_an_overflow(tiny_shards, tmp_path,
                                                                                monkeypatch):
    if not hasattr(torch.amp, "GradScaler"):
        pytest.skip("torch.amp.GradScaler is missing in this torch")
    real = next_token_lib.token_loss_sum
    calls = {"n": 0}

    def overflow_once(logits, targets):
        calls["n"] += 1
        out = real(logits, targets)
        return out * float("inf") if calls["n"] == 2 else out  # step 2's gradients overflow

    monkeypatch.setattr(next_token_lib, "token_loss_sum", overflow_once)
    loop.train(_cfg("fp16"), tiny_shards, tmp_path / "run", progress=False)
    rows = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    scales = [r["loss_scale"] for r in rows]
    assert len(scales) == 4
    # GradScaler's defaults: 2^16 to start, halved after an inf/nan step, growth only after 2000.
    assert scales[0] == scales[1] == 2.0**16
    assert rows[1]["skipped"] is True
    assert scales[2] == scales[3] == 2.0**15


def test_fp32_rows_have_no_loss_scale(tiny_shards, tmp_path):
    loop.train(_cfg("fp32"), tiny_shards, tmp_path / "run", progress=False)
    rows = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert rows and all("loss_scale" not in r for r in rows)
