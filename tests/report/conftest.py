"""A tiny real run (trained, stopped, resumed) shared by the report tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gptforge.config import ModelConfig, RunConfig, TrainConfig


def _cfg(**kw) -> RunConfig:
    tc = dict(max_steps=12, micro_batch_size=2, lr=3e-3, warmup_steps=2, eval_interval=4, eval_steps=1,
              checkpoint_interval=0, keep_checkpoints=1)
    tc.update(kw)
    return RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32), train=TrainConfig(**tc))


@pytest.fixture(scope="session")
def real_run(tiny_shards, tmp_path_factory) -> Path:
    """12 steps of gpt2-nano, stopped at step 6 and resumed (TensorBoard on: the resume is visible)."""
    from gptforge.train.run import train

    run = tmp_path_factory.mktemp("runs") / "nano"
    train(_cfg(stop_at_step=6), tiny_shards, run, progress=False)
    train(_cfg(), tiny_shards, run, resume=True, progress=False)
    return run


def write_rows(run: Path, rows: list[dict], config: str | None = None) -> Path:
    """A hand-made run directory: metrics.jsonl from `rows` (and config.yaml text)."""
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if config is not None:
        (run / "config.yaml").write_text(config)
    return run
