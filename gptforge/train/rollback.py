"""`train.spike_action rollback`: on a loss spike, go back to the last good checkpoint and skip the
batches that led to it.

This is the recipe large runs use (PaLM, Chowdhery et al. 2022, section 5.1: restart from a
checkpoint some 100 steps before the spike and skip the few hundred batches seen before and
during it). A spike that goes away when its batches are skipped came from those batches meeting
that state of the model; one that keeps coming back needs another lr or clip, which is why the
number of rollbacks is bounded (`train.max_rollbacks`).

Data position. A run's batch of optimizer step k (0-based) is batch number `k + data_offset` of
its BatchSource (`Batches.micro_batches(index)`), `data_offset` starting at 0. A rollback from
step S (the 1-based step whose loss spiked) to checkpoint step C restores everything the
checkpoint holds (model, optimizer, scheduler position, RNG, the detector's window, early
stopping: every component registered with the Checkpointer, through the same reload as
--resume, gptforge.train.state) and adds S - C to `data_offset`: the batches steps C+1..S had read are never read
again, and step C+1 reads the first batch no step has read. The rollback record (`state_dict`)
is not taken from the checkpoint but kept across the reload, and saved in every later
checkpoint, so a resumed run reads the same batches as an uninterrupted one.

What triggers a rollback: a "spike" or "divergence" event on the loss (gptforge.train.spikes),
and a streak of train.max_bad_steps non-finite steps (which would otherwise stop the run).
Gradient-norm spikes alone do not: clipping already bounds their update.

Distributed runs: the detector sees the all-reduced loss and the global gradient norm, the same
numbers on every rank, so every rank decides alike and reloads the same checkpoint (each its own
RNG state). The trainer allows it under plain DDP (tested against a single process) and refuses
it for the layouts where it is not tested (FSDP2/ZeRO, tp, pp, DeepSpeed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from gptforge.errors import TrainingError


def rollback_trigger(events: list[dict[str, Any]], bad_streak_full: bool) -> str | None:
    """Why this step calls for a rollback, or None.

    Args:
        events: the step's event dicts (`SpikeEvent.as_dict()`).
        bad_streak_full: whether train.max_bad_steps non-finite steps came in a row.

    Returns: "loss spike", "loss divergence", "non-finite steps" or None.
    """
    for e in events:
        if e.get("metric") == "loss" and e.get("kind") in ("spike", "divergence"):
            return f"loss {e['kind']}"
    return "non-finite steps" if bad_streak_full else None


class RollbackState:
    """What rollbacks did so far: how many, the data offset, the batch ranges skipped.

    Args:
        max_rollbacks: rollbacks allowed in a run (counted over resumes).
    """

    def __init__(self, max_rollbacks: int):
        self.max_rollbacks = max_rollbacks
        self.count = 0
        self.data_offset = 0
        self.skipped: list[dict[str, Any]] = []
        """One record per rollback: from_step, to_step, first_batch, last_batch, skipped_batches, reason."""

    def data_index(self, step: int) -> int:
        """The BatchSource batch number that 0-based optimizer step `step` reads."""
        return step + self.data_offset

    def check_allowed(self, step: int, reason: str, ckpt_root) -> None:
        """Raises TrainingError when `max_rollbacks` rollbacks were already made."""
        if self.count >= self.max_rollbacks:
            done = ", ".join(f"{r['from_step']}->{r['to_step']}" for r in self.skipped) or "none"
            raise TrainingError(
                f"{reason} at step {step} after train.max_rollbacks={self.max_rollbacks} rollback(s) ({done}): "
                f"stopping. Skipping data did not cure it, so the model or its settings are the cause: resume "
                f"from the last good checkpoint in {ckpt_root} with a lower train.lr (2-3x), more "
                "train.warmup_steps or train.grad_clip 1.0."
            )

    def record(self, from_step: int, to_step: int, reason: str) -> dict[str, Any]:
        """Account a rollback from 1-based step `from_step` to checkpoint step `to_step` (< from_step).

        Returns: the metrics event {"kind": "rollback", "step", "from_step", "to_step",
        "skipped_batches", "first_batch", "last_batch", "reason", "rollbacks"}.
        """
        n = from_step - to_step
        first = self.data_index(to_step)
        rec = {"from_step": from_step, "to_step": to_step, "first_batch": first, "last_batch": first + n - 1,
               "skipped_batches": n, "reason": reason}
        self.data_offset += n
        self.count += 1
        self.skipped.append(rec)
        return {"kind": "rollback", "step": from_step, **rec, "rollbacks": self.count}

    @staticmethod
    def message(event: dict[str, Any], ckpt_name: str, max_rollbacks: int) -> str:
        """One progress line for a rollback event."""
        return (f"step {event['from_step']}: {event['reason']}: rolled back to {ckpt_name} (step {event['to_step']}); "
                f"skipping batches {event['first_batch']}-{event['last_batch']} ({event['skipped_batches']}); "
                f"rollback {event['rollbacks']} of train.max_rollbacks {max_rollbacks}")

    def state_dict(self) -> dict[str, Any]:
        """Plain data for trainer_state.pt."""
        return {"count": self.count, "data_offset": self.data_offset, "skipped": [dict(r) for r in self.skipped]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = int(state.get("count", 0))
        self.data_offset = int(state.get("data_offset", 0))
        self.skipped = [dict(r) for r in state.get("skipped", [])]


class SpikeRollback:
    """The loop component of train.spike_action rollback: after each step's events are known, it
    decides whether the step calls for a rollback and makes it.

    Args:
        record: the run's RollbackState (registered with the checkpointer, kept across a rollback).
        checkpointer: the run's gptforge.train.components.Checkpointer (its `restore` reloads).
        bad_steps: the run's BadStepGuard (the non-finite streak).
        metrics: the run's MetricsLogger (rows and messages).
        run_dir: the run directory. tc: the resolved TrainConfig (spike_action, max_bad_steps,
            max_rollbacks).
        on_stop: called with the run's stop reason ("non_finite", "max_rollbacks") before this
            component raises TrainingError.
    """

    def __init__(self, record: RollbackState, checkpointer, bad_steps, metrics, run_dir: Path, tc,
                 on_stop: Callable[[str], None]):
        self.record, self.checkpointer, self.bad_steps, self.metrics = record, checkpointer, bad_steps, metrics
        self.run_dir, self.tc, self.on_stop = Path(run_dir), tc, on_stop
        self.rolled_back = False
        """Whether this session rolled back at least once."""

    def maybe_roll_back(self, row: dict[str, Any]) -> bool:
        """On a loss spike or a full streak of non-finite steps, reload the last checkpoint before
        this step and skip the batches read since it. Logs this step's row with a `rollback` event.
        Returns True when it rolled back (the loop continues from the checkpoint's step); always
        False unless train.spike_action is rollback.

        Without a checkpoint before this step it says so and goes on as `warn` (a non-finite
        streak then stops the run as under `warn`).

        Raises:
            TrainingError: train.max_rollbacks rollbacks were made already (the row, with a `stop`
                event, is logged first), or the non-finite streak had no checkpoint to go back to.
        """
        tc = self.tc
        if tc.spike_action != "rollback":
            return False
        bad_streak = self.bad_steps.in_row >= tc.max_bad_steps
        reason = rollback_trigger(row.get("events") or [], bad_streak)
        if reason is None:
            return False
        done = row["step"]
        found, why_not = self.checkpoint_before(done)
        if found is None:
            self.metrics.message(f"step {done}: {reason}, and {why_not}: nothing to roll back to, continuing as "
                                 "train.spike_action warn")
            if bad_streak:
                self.metrics.log(row, force=True)
                self.on_stop("non_finite")
                self.bad_steps.check()
            return False
        try:
            self.record.check_allowed(done, reason, self.checkpointer.ckpt_root)
        except TrainingError:
            row.setdefault("events", []).append(
                {"kind": "stop", "step": done, "reason": f"{reason} after train.max_rollbacks "
                                                          f"({tc.max_rollbacks}) rollbacks"})
            self.metrics.log(row, force=True)
            self.on_stop("max_rollbacks")
            raise
        # The checkpoint's state, but the wall time spent and the rollback record go on.
        loaded, removed = self.checkpointer.restore(found, rollback=True)
        for d in removed:  # what was saved after the checkpoint rolled back to is of the abandoned history
            self.metrics.message(f"step {done}: rollback removed {d.name}, newer than {found.name}")
        event = self.record.record(done, int(loaded["step"]), reason)
        row.setdefault("events", []).append(event)
        self.metrics.log(row, force=True)
        self.metrics.message(RollbackState.message(event, found.name, tc.max_rollbacks))
        self.rolled_back = True
        return True

    def checkpoint_before(self, step: int) -> tuple[Path | None, str]:
        """The newest intact checkpoint of this run written before 1-based `step`, or (None, why not)."""
        from gptforge.errors import DamagedFileError
        from gptforge.runtime import checkpoint as ckpt_lib

        try:
            found = ckpt_lib.find_checkpoint(self.run_dir)
        except FileNotFoundError:
            return None, "no checkpoint was written yet"
        except DamagedFileError as e:
            return None, f"the checkpoints are damaged ({e})"
        saved = int(ckpt_lib.load_trainer_state(found).get("step", 0))
        if saved >= step:
            return None, f"the latest checkpoint ({found.name}) is not before it"
        return found, ""
