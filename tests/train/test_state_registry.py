"""The trainer's stateful components share one save and one reload (gptforge.train.state)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gptforge.train.components import BadStepGuard, Checkpointer, EarlyStopping
from gptforge.train.rollback import RollbackState
from gptforge.train.spikes import SpikeDetector
from gptforge.train.state import Fields, StateRegistry


def _registry(counters: dict, early: EarlyStopping, spikes: SpikeDetector, record: RollbackState,
              bad: BadStepGuard) -> StateRegistry:
    reg = StateRegistry()
    reg.register(None, Fields(counters, ("step", "tokens_seen")))
    reg.register(None, Fields(counters, ("elapsed_seconds",)), on_rollback=False)
    reg.register(None, early)
    reg.register("spikes", spikes)
    reg.register("rollback", record, on_rollback=False)
    reg.register(None, bad)
    return reg


def test_the_saved_layout_keeps_the_top_level_keys_checkpoints_always_had(tmp_path):
    counters = {"step": 7, "tokens_seen": 700, "elapsed_seconds": 3.5}
    early = EarlyStopping(patience=2)
    early.update(2.5)
    reg = _registry(counters, early, SpikeDetector(), RollbackState(3), BadStepGuard(5, False, tmp_path))
    saved = reg.state_dict()
    assert saved["step"] == 7 and saved["tokens_seen"] == 700 and saved["elapsed_seconds"] == 3.5
    assert saved["best_val_loss"] == 2.5 and saved["best_metric"] == "val_loss"
    assert saved["rollback"] == {"count": 0, "data_offset": 0, "skipped": []}
    assert set(saved["spikes"]) == {"history", "loss_spikes_in_row", "above_ceiling"}


def test_resume_reloads_everything_and_a_rollback_keeps_what_it_was_registered_to_keep(tmp_path):
    record = RollbackState(3)
    saved = _registry({"step": 4, "tokens_seen": 400, "elapsed_seconds": 2.0}, EarlyStopping(0),
                      SpikeDetector(), record, BadStepGuard(5, False, tmp_path)).state_dict()
    saved["rollback"] = {"count": 1, "data_offset": 3, "skipped": []}
    saved["best_val_loss"] = 1.25

    def fresh():
        counters = {"step": 9, "tokens_seen": 900, "elapsed_seconds": 8.0}
        early, rec, bad = EarlyStopping(0), RollbackState(3), BadStepGuard(5, False, tmp_path)
        rec.load_state_dict({"count": 2, "data_offset": 5})
        bad.in_row = 4
        return counters, early, rec, bad, _registry(counters, early, SpikeDetector(), rec, bad)

    counters, early, rec, bad, reg = fresh()
    reg.load_state_dict(saved)  # --resume
    assert counters == {"step": 4, "tokens_seen": 400, "elapsed_seconds": 2.0}
    assert early.best == 1.25 and (rec.count, rec.data_offset) == (1, 3) and bad.in_row == 0

    counters, early, rec, bad, reg = fresh()
    reg.load_state_dict(saved, rollback=True)
    assert counters == {"step": 4, "tokens_seen": 400, "elapsed_seconds": 8.0}  # the wall time goes on
    assert early.best == 1.25 and bad.in_row == 0
    assert (rec.count, rec.data_offset) == (2, 5)  # the rollback record is kept across a rollback


def test_a_checkpoint_without_a_keyed_component_leaves_it_as_it_is(tmp_path):
    spikes = SpikeDetector()
    spikes.loss_spikes_in_row = 2
    reg = StateRegistry()
    reg.register("spikes", spikes)
    reg.load_state_dict({"step": 3})  # written with spike alarms off
    assert spikes.loss_spikes_in_row == 2


def test_two_components_may_not_save_the_same_key():
    reg = StateRegistry()
    reg.register("spikes", SpikeDetector())
    with pytest.raises(ValueError, match="registered already"):
        reg.register("spikes", SpikeDetector())
    values = {"step": 1}
    reg.register(None, Fields(values, ("step",)))
    reg.register(None, Fields(values, ("step",)))
    with pytest.raises(ValueError, match=r"\['step'\] saved by two components"):
        reg.state_dict()


class _Engine:
    """Stands in for the engine: keeps what it saves, gives it back on load."""

    def __init__(self):
        self.saved: dict = {}

    def save(self, ckpt_root: Path, step: int, state: dict, config_yaml: str, keep: int, best: bool) -> Path:
        folder = ckpt_root / f"step_{step}"
        folder.mkdir(parents=True)
        self.saved[folder] = dict(state)
        return folder

    def load(self, folder: Path) -> dict:
        return dict(self.saved[folder])


def test_the_checkpointer_saves_the_registered_components_and_restores_them(tmp_path):
    engine, counters = _Engine(), {"step": 2}
    ck = Checkpointer(engine, tmp_path / "checkpoints", "", interval=2, keep=0,
                      data_state=lambda step: {"step": step}, on_save=None, is_main=False)
    ck.register(None, Fields(counters, ("step",)))
    folder = ck.maybe_save(2, best=False, bad=False, force=False)
    assert engine.saved[folder] == {"step": 2, "data": {"step": 2}}
    assert ck.maybe_save(3, best=False, bad=False, force=False) is None
    counters["step"] = 5
    loaded, removed = ck.restore(folder)
    assert counters["step"] == 2 and loaded["data"] == {"step": 2} and removed == []
