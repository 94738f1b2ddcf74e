"""A real SIGKILL in the middle of a checkpoint write, then --resume: the uninterrupted losses.

A forked child trains with the checkpoint writer wrapped so that the process SIGKILLs itself
at an exact point of a save (no cleanup code runs, as with `kill -9`): after the DCP files are
in the temp folder but before trainer_state.pt, or after the rename to step_N but before the
`latest` pointer names it; and during the first save, which leaves logged steps but nothing to
resume from (--resume then starts fresh: the same seed gives the same steps again). bench/kill_soak.py does the same with random kills.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path

import pytest

from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.runtime import checkpoint as ck
from gptforge.train.loggers import read_metrics
from gptforge.train.run import train

STEPS, INTERVAL = 8, 3


def _train_and_die(point: str, step: int, data: str, run: str) -> None:
    """In a forked child: train, SIGKILLing this process at `point` of the save at `step`."""
    at = ck.step_dir_name(step)
    if point == "dcp":
        write = ck._write_checkpoint

        def write_then_die(tmp, *a, **k):
            saved = write(tmp, *a, **k)
            if tmp.name == f".tmp_{at}":
                os.kill(os.getpid(), signal.SIGKILL)
            return saved

        ck._write_checkpoint = write_then_die
    else:
        write_text = ck.atomic_write_text

        def die_before_pointer(path, text, *a, **k):
            if Path(path).name == "latest" and text.strip() == at:
                os.kill(os.getpid(), signal.SIGKILL)
            return write_text(path, text, *a, **k)

        ck.atomic_write_text = die_before_pointer
    train(_cfg(), data, run, progress=False)


def _cfg() -> RunConfig:
    return RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32, dropout=0.1),
                     train=TrainConfig(max_steps=STEPS, micro_batch_size=2, lr=3e-3, warmup_steps=2,
                                       eval_interval=INTERVAL, eval_steps=1, checkpoint_interval=INTERVAL,
                                       tensorboard=False, report=False, precision="fp32", spike_alarms=False))


@pytest.fixture(scope="module")
def uninterrupted(tiny_shards, tmp_path_factory) -> list[dict]:
    run = tmp_path_factory.mktemp("full") / "run"
    assert train(_cfg(), tiny_shards, run, progress=False).step == STEPS
    return read_metrics(run)


@pytest.mark.parametrize("point,step", [("dcp", 2 * INTERVAL), ("pointer", 2 * INTERVAL), ("dcp", INTERVAL)],
                         ids=["dcp-written", "before-latest", "first-checkpoint"])
def test_sigkill_during_a_checkpoint_write_resumes_to_the_same_losses(point, step, uninterrupted, tiny_shards,
                                                                      tmp_path):
    run = tmp_path / "run"
    # fork: the child starts with everything imported (a fresh interpreter costs seconds)
    p = multiprocessing.get_context("fork").Process(target=_train_and_die,
                                                    args=(point, step, str(tiny_shards), str(run)))
    p.start()
    p.join(120)
    assert p.exitcode == -signal.SIGKILL
    root = run / "checkpoints"
    name, before = ck.step_dir_name(step), ck.step_dir_name(step - INTERVAL)
    if point == "dcp":  # the temp folder holds DCP files but no trainer state
        assert (root / f".tmp_{name}" / ".metadata").exists()
        assert not (root / f".tmp_{name}" / ck.STATE_FILE).exists()
        assert not (root / name).exists()
    else:  # step_N is complete but `latest` still names the one before
        assert ck.verify_checkpoint(root / name) is None
    if step > INTERVAL:
        assert (root / "latest").read_text().strip() == before
    else:  # killed during the first checkpoint: training progress but nothing to resume from
        assert not (root / "latest").exists() and not list(root.glob("step_*"))
    assert [r["step"] for r in read_metrics(run)] == list(range(1, step + 1))

    said: list[str] = []
    res = train(_cfg(), tiny_shards, run, resume=True, progress=False, log=said.append)
    assert res.step == STEPS
    if step == INTERVAL:
        assert any("starting fresh" in m for m in said)
    assert not list(root.glob(".tmp_*"))  # the dead writer's temp folder is gone
    got = read_metrics(run)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    assert [(r["loss"], r.get("val_loss")) for r in got] == [(r["loss"], r.get("val_loss")) for r in uninterrupted]
