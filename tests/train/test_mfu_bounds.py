"""MFU above 100% (a wrong device peak) is logged as no figure rather than a false one."""

from __future__ import annotations

from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.train.run import train


def test_mfu_above_100_percent_is_not_a_number(tiny_shards, tmp_path, monkeypatch):
    import gptforge.train.trainer as trainer_mod
    from gptforge.train.mfu import Peak

    monkeypatch.setattr(trainer_mod, "device_peak", lambda device, precision: Peak(1.0, "a wrong peak"))
    run = tmp_path / "run"
    r = train(RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32),
                        train=TrainConfig(max_steps=2, micro_batch_size=2, eval_interval=0, tensorboard=False,
                                          report=False)), tiny_shards, run, progress=False)
    assert all(row["mfu"] is None for row in r.history)

