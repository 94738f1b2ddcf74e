"""A time-budgeted run (--train.max_minutes) sets its step count, stops at the budget and resumes."""

from __future__ import annotations

import pytest
import yaml

from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.train.loggers import read_metrics
from gptforge.train.run import train


def test_a_time_budgeted_run_sets_its_steps_stops_and_resumes(tiny_shards, tmp_path, monkeypatch):
    import gptforge.train.budget as budget

    monkeypatch.setattr(budget, "measure_step_seconds", lambda mc, tc, repeats=3, whole=True: 5.0)  # 5 s/step
    cfg = RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32),
                    train=TrainConfig(max_minutes=5.0, micro_batch_size=2, eval_interval=0, warmup_steps=2,
                                      tensorboard=False, report=False))
    run = tmp_path / "run"
    said = []
    r = train(cfg, tiny_shards, run, progress=False, log=said.append)
    saved = yaml.safe_load((run / "config.yaml").read_text())["train"]
    assert saved["max_steps"] == saved["max_minutes_steps"] == 60  # 300 s / 5 s (no evaluation share)
    assert any("train.max_steps 60" in m for m in said)
    assert r.step == 60  # the real steps are much faster than 5 s: all planned steps fit
    # A budget used up stops the run with a checkpoint; a resume with a larger budget continues.
    cfg2 = RunConfig(model=cfg.model, train=TrainConfig(max_minutes=1e-7, micro_batch_size=2, eval_interval=0,
                                                        warmup_steps=2, tensorboard=False, report=False))
    run2 = tmp_path / "run2"
    r2 = train(cfg2, tiny_shards, run2, progress=False)
    assert r2.stopped == "max_minutes" and r2.step == 1
    monkeypatch.setattr(budget, "measure_step_seconds", lambda *a, **k: pytest.fail("resume must not re-measure"))
    doc = yaml.safe_load((run2 / "config.yaml").read_text())
    tc = TrainConfig(**{**doc["train"], "max_minutes": 10.0})
    r3 = train(RunConfig(model=cfg.model, train=tc), tiny_shards, run2, resume=True, progress=False)
    assert r3.step == doc["train"]["max_steps"] and [row["step"] for row in read_metrics(run2)][0] == 1

