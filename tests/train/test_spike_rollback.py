"""train.spike_action rollback: a poisoned data window makes the loss spike at a known step; the run
reloads the last checkpoint, skips the window and goes on (gptforge.train.rollback)."""

from __future__ import annotations

import dataclasses
import math

import pytest

import gptforge.train.objectives.next_token as next_token_lib
from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.errors import InputError, TrainingError
from gptforge.runtime import checkpoint as ck
from gptforge.train.loggers import read_metrics
from gptforge.train.run import train
from gptforge.train.sources import BatchesBase, ShardSource

POISON_TOKEN = 1
"""Every target of a poisoned batch is this token: a loss far above the curve's (about 6.9 nats
against a median of 5.3 at step 30 of the runs below, robust z above 20)."""


class _PoisonedBatches(BatchesBase):
    def __init__(self, inner, source):
        self.inner, self.source = inner, source
        self.global_batch_size, self.tokens_per_step, self.seq_len = (inner.global_batch_size, inner.tokens_per_step,
                                                                      inner.seq_len)

    def micro_batches(self, index: int):
        self.source.read.append(index)
        self.source.current = index
        micro = self.inner.micro_batches(index)
        if index in self.source.poison:
            micro = [(x, y.clone().fill_(POISON_TOKEN)) for x, y in micro]
        return micro


class PoisonedShards:
    """A ShardSource whose batch numbers in `poison` have every target set to POISON_TOKEN; it
    records the batch numbers read (`read`) and the one being trained (`current`)."""

    def __init__(self, data_dir, poison=()):
        self.inner = ShardSource(data_dir, eval_steps=1, micro_batch_size=4)
        self.poison = set(poison)
        self.read: list[int] = []
        self.current = -1

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def batches(self, block_size, tc, dp_rank, dp_size):
        return _PoisonedBatches(self.inner.batches(block_size, tc, dp_rank, dp_size), self)


def _cfg(**kw):
    base = dict(max_steps=40, micro_batch_size=4, lr=3e-3, warmup_steps=2, eval_interval=0, checkpoint_interval=10,
                spike_action="rollback", tensorboard=False, report=False, seed=7)
    base.update(kw)
    return RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32, n_layer=2, d_model=32, n_head=2),
                     train=TrainConfig(**base))


def _events(run_dir, kind):
    return [e for r in read_metrics(run_dir) for e in r.get("events") or [] if e["kind"] == kind]


@pytest.fixture(scope="module")
def rolled(tiny_shards, tmp_path_factory):
    """One uninterrupted rollback run: batch 29 (step 30) poisoned, checkpoints every 10 steps."""
    run = tmp_path_factory.mktemp("rolled") / "run"
    src = PoisonedShards(tiny_shards, poison={29})
    res = train(_cfg(tensorboard=True, report=True), tiny_shards, run, progress=False, data=src)
    return run, res, src


def test_rollback_reloads_the_checkpoint_and_skips_the_poisoned_window(rolled):
    run, res, src = rolled
    (rb,) = _events(run, "rollback")
    assert (rb["from_step"], rb["to_step"], rb["skipped_batches"], rb["first_batch"], rb["last_batch"]) == \
           (30, 20, 10, 20, 29)
    assert rb["reason"] == "loss spike" and rb["rollbacks"] == 1
    (spike,) = [e for e in _events(run, "spike") if e["metric"] == "loss"]
    assert spike["step"] == 30
    # Steps 1-30 read batches 0-29; after the reload steps 21-40 read 30-49: 20-29 are never read again.
    assert src.read == list(range(30)) + list(range(30, 50))
    assert res.step == 40 and res.stopped == "max_steps"
    assert math.isfinite(res.train_loss) and res.train_loss < spike["value"] - 1.0
    # The spiked row is logged, then steps 21..40 again; the report keeps the last row of each step.
    steps = [r["step"] for r in read_metrics(run) if "loss" in r]
    assert steps == list(range(1, 31)) + list(range(21, 41))
    state = ck.load_trainer_state(ck.find_checkpoint(run))
    assert state["step"] == 40 and state["rollback"]["data_offset"] == 10 and state["rollback"]["count"] == 1
    # TensorBoard's text tab and the report mark it.
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    tags = {(v.tag, e.step) for f in (run / "tb").glob("events.out.tfevents.*")
            for e in EventFileLoader(str(f)).Load() if e.HasField("summary") for v in e.summary.value}
    assert ("events/rollback/text_summary", 30) in tags
    page = (run / "report.html").read_text()
    assert "rolled back to 20" in page and "30 -&gt; 20 (10 batches skipped, loss spike)" in page


def test_warn_does_not_roll_back(tiny_shards, tmp_path):
    src = PoisonedShards(tiny_shards, poison={29})
    res = train(_cfg(spike_action="warn"), tiny_shards, tmp_path / "run", progress=False, data=src)
    assert _events(tmp_path / "run", "rollback") == []
    assert any(e["metric"] == "loss" and e["step"] == 30 for e in _events(tmp_path / "run", "spike"))
    assert src.read == list(range(40)) and res.step == 40


def test_resume_after_a_rollback_is_exact(rolled, tiny_shards, tmp_path):
    _, full, _ = rolled
    run = tmp_path / "run"
    # Stop at step 35 of the second pass (after the rollback from 30 to 20), then resume to 40.
    first = train(_cfg(stop_at_step=35), tiny_shards, run, progress=False, data=PoisonedShards(tiny_shards, {29}))
    assert first.stopped == "stop_at_step" and first.step == 35
    src = PoisonedShards(tiny_shards, {29})
    rest = train(_cfg(), tiny_shards, run, resume=True, progress=False, data=src)
    assert src.read == list(range(45, 50))  # the rollback's data offset came back with the checkpoint
    want = [r["loss"] for r in full.history][-5:]
    assert [r["loss"] for r in rest.history] == want  # bit for bit
    assert [r["step"] for r in rest.history] == [36, 37, 38, 39, 40]


def test_max_rollbacks_stops_the_run(tiny_shards, tmp_path):
    run = tmp_path / "run"
    src = PoisonedShards(tiny_shards, poison=set(range(25, 100)))  # every batch from step 26 on is bad
    with pytest.raises(TrainingError, match=r"train.max_rollbacks=2 rollback\(s\) \(26->25, 26->25\)"):
        train(_cfg(checkpoint_interval=5, max_rollbacks=2), tiny_shards, run, progress=False, data=src)
    assert [(e["from_step"], e["to_step"], e["first_batch"]) for e in _events(run, "rollback")] == \
           [(26, 25, 25), (26, 25, 26)]
    (stop,) = _events(run, "stop")
    assert stop["step"] == 26 and "max_rollbacks" in stop["reason"]
    assert ck.find_checkpoint(run).name == "step_0000025"  # nothing after the last good checkpoint


def test_no_checkpoint_yet_goes_on_as_warn(tiny_shards, tmp_path, capsys):
    src = PoisonedShards(tiny_shards, poison={24})
    res = train(_cfg(max_steps=27, checkpoint_interval=100), tiny_shards, tmp_path / "run", data=src)
    out = capsys.readouterr().out
    assert "step 25: loss spike, and no checkpoint was written yet: nothing to roll back to" in out
    assert _events(tmp_path / "run", "rollback") == [] and src.read == list(range(27)) and res.step == 27


def test_a_non_finite_streak_rolls_back_and_the_progress_line_says_so(tiny_shards, tmp_path, monkeypatch, capsys):
    src = PoisonedShards(tiny_shards)
    real = next_token_lib.token_loss_sum
    monkeypatch.setattr(next_token_lib, "token_loss_sum",
                        lambda logits, targets: real(logits, targets) * (math.nan if src.current in (23, 24) else 1))
    res = train(_cfg(max_steps=30, max_bad_steps=2), tiny_shards, tmp_path / "run", data=src)
    (rb,) = _events(tmp_path / "run", "rollback")
    assert (rb["from_step"], rb["to_step"], rb["skipped_batches"], rb["reason"]) == (25, 20, 5, "non-finite steps")
    assert src.read == list(range(25)) + list(range(25, 35)) and res.step == 30 and math.isfinite(res.train_loss)
    assert ("step 25: non-finite steps: rolled back to step_0000020 (step 20); skipping batches 20-24 (5); "
            "rollback 1 of train.max_rollbacks 3") in capsys.readouterr().out


@pytest.mark.parametrize("kw, match", [
    (dict(spike_action="revert"), "spike_action='revert': must be warn or rollback"),
    (dict(max_rollbacks=0), "max_rollbacks=0: must be >= 1"),
    (dict(spike_alarms=False), "spike_alarms is false"),
    (dict(checkpoint_interval=0, eval_interval=0), "needs checkpoints to roll back to"),
])
def test_options_are_range_checked(kw, match):
    with pytest.raises(InputError, match=match):
        TrainConfig(**{"spike_action": "rollback", **kw}).check_trainable()


@pytest.mark.slow  # two gloo processes: 20-30 s on 2 shared, loaded cores
def test_two_ddp_ranks_roll_back_as_one_process_does(rolled, tiny_shards, tmp_path):
    # Every rank sees the all-reduced loss and global gradient norm, so all take the same decision.
    from tests.train.dist_harness import run_layouts

    _, single, _ = rolled
    cfg = _cfg()
    job = dict(name="ddp", model=dataclasses.asdict(cfg.model),
               # Checkpoints at 20 and 40 only (fewer writes); the rollback still goes to 20.
               train={**dataclasses.asdict(cfg.train), "micro_batch_size": 2, "checkpoint_interval": 20},
               parallel=dict(dp_replicate=2),
               data=str(tiny_shards), run_dir=str(tmp_path / "run"), source=f"{__name__}:PoisonedShards",
               source_kwargs={"poison": [29]})
    res = run_layouts(2, [job], tmp_path / "out")["ddp"]
    assert "error" not in res, res["error"]
    # Summation order differs between 1 and 2 ranks: rows agree to ~1e-7, a few to 1e-5 after 49 steps.
    want = [r["loss"] for r in single.history]
    assert len(res["loss"]) == len(want) == 50
    rel = [abs(a - b) / abs(b) for a, b in zip(res["loss"], want, strict=True)]
    assert max(rel) <= 1e-4, " ".join(f"{i + 1}:{r:.1e}" for i, r in enumerate(rel))
    (rb,) = _events(tmp_path / "run", "rollback")
    assert (rb["from_step"], rb["to_step"], rb["skipped_batches"]) == (30, 20, 10)


def test_sharded_layouts_are_refused(tiny_shards, tmp_path):
    from gptforge.config import ParallelConfig
    from gptforge.train.parallel.distributed import DistEnv
    from gptforge.train.trainer import Trainer

    env = DistEnv(world_size=2, dp_size=2, mesh=object())  # as a 2-process run sees itself
    for parallel in (dict(dp_shard=2), dict(dp_shard=1, tp=2), dict(dp_shard=1, pp=2),
                     dict(dp_shard=1, dp_replicate=2, zero_stage=1)):
        cfg = RunConfig(model=_cfg().model, train=_cfg().train, parallel=ParallelConfig(**parallel))
        with pytest.raises(InputError, match="spike_action=rollback runs in a single process or under plain DDP"):
            Trainer(cfg, env, PoisonedShards(tiny_shards), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_wandb_keeps_increasing_steps_only(tmp_path):
    pytest.importorskip("wandb")
    from gptforge.train.wandb_logger import WandbLogger

    class Recorder:
        def __init__(self):
            self.steps = []

        def log(self, data, step):
            self.steps.append((step, data["train/loss"]))

    logger = WandbLogger(tmp_path, "p", mode="offline")
    logger._run = rec = Recorder()  # as started; the real wandb refuses a decreasing step with a warning
    for step, loss in [(1, 5.0), (2, 4.9), (3, 9.0), (2, 4.8), (3, 4.7), (4, 4.6)]:  # a rollback from 3 to 1
        logger.log({"step": step, "loss": loss})
    assert rec.steps == [(1, 5.0), (2, 4.9), (3, 9.0), (4, 4.6)]
