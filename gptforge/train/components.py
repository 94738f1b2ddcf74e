"""The trainer's components: each decides whether a step is its step and owns its own state.

- `StopFlag`: SIGINT/SIGTERM ask for a checkpoint and a clean stop; a second signal exits at once.
- `BadStepGuard`: counts consecutive non-finite steps and stops the run after `max_bad_steps`.
- `Evaluator`: validation every `eval_interval` steps and at the last step.
- `EarlyStopping`: the best value of train.best_metric and the evaluations since it (checkpointed).
- `TaskEvaluator`: task scores (train.eval_tasks) every `eval_interval` steps.
- `Checkpointer`: periodic, best, final, early-stop and signal checkpoints through the engine, and
  the one reload of every registered component (gptforge.train.state) for resume and rollback.
- `MetricsLogger`: metrics.jsonl / TensorBoard rows and the progress line.
"""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path
from typing import Any, Callable

from gptforge.errors import TrainingError
from gptforge.train.state import Stateful, StateRegistry


class StopFlag:
    """Set by SIGINT/SIGTERM; the trainer checkpoints after the current step and exits.

    A second signal ends the process at once (os._exit, status 128 + signal): the first already
    asked for a checkpoint, and a long step or evaluation must not keep the user waiting.
    """

    def __init__(self):
        self.signal: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self):
        for s in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[s] = signal.signal(s, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum, frame):
        if self.signal is not None:
            # Out now, without unwinding: checkpoints are written to a temp folder and renamed, and
            # every metrics row is flushed, so nothing written so far can be left damaged.
            os.write(2, f"\nsecond signal {signum}: exiting now; a checkpoint being saved may be left unfinished "
                        "(--resume uses the newest complete one)\n".encode())
            os._exit(128 + signum)
        self.signal = signum

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)


class BadStepGuard:
    """Consecutive steps with a non-finite loss or gradient norm.

    Under fp16 the loss scaler skips steps with inf/nan gradients as routine, so there only a
    non-finite loss counts. The streak is not checkpointed: a reload (resume or rollback) starts
    it at 0.
    """

    def __init__(self, max_bad_steps: int, has_loss_scaler: bool, ckpt_root: Path):
        self.max_bad_steps, self.has_loss_scaler, self.ckpt_root = max_bad_steps, has_loss_scaler, ckpt_root
        self.in_row = 0

    def update(self, step: int, loss: float, finite: bool) -> bool:
        """Record step `step`; returns whether it was bad. Call `check` after logging the row."""
        bad = not math.isfinite(loss) if self.has_loss_scaler else not finite
        self.in_row = self.in_row + 1 if bad else 0
        self.step = step
        return bad

    def check(self) -> None:
        """Raises TrainingError once `max_bad_steps` bad steps came in a row."""
        if self.in_row >= self.max_bad_steps:
            kept = (f"The last good checkpoint is kept in {self.ckpt_root}." if any(self.ckpt_root.glob("step_*"))
                    else "No checkpoint was written before it.")
            fp16 = ", or bf16 instead of fp16" if self.has_loss_scaler else ""
            raise TrainingError(
                f"{self.in_row} consecutive steps with a non-finite loss or gradient (step {self.step}); "
                f"stopping. {kept} Try a lower train.lr or train.grad_clip{fp16}."
            )

    def state_dict(self) -> dict[str, Any]:
        """Nothing: the streak is not saved."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A reloaded checkpoint starts a new streak."""
        self.in_row = 0


class Evaluator:
    """Runs `evaluate()` (mean val loss, nats/token) every `interval` steps and at `max_steps`."""

    def __init__(self, evaluate: Callable[[], float | None], interval: int, max_steps: int, enabled: bool):
        self.evaluate, self.interval, self.max_steps = evaluate, interval, max_steps
        self.enabled = enabled and interval > 0
        self.last: float | None = None

    def maybe_evaluate(self, step: int) -> float | None:
        """The val loss when `step` is an evaluation step, else None."""
        if not self.enabled or not (step % self.interval == 0 or step == self.max_steps):
            return None
        val = self.evaluate()
        if val is not None:  # None: interrupted between batches, keep the last figure
            self.last = val
        return val


class EarlyStopping:
    """Best value of the metric that picks the best checkpoint (val_loss by default, or a task
    metric); stop after `patience` evaluations without improvement (0: never)."""

    def __init__(self, patience: int, metric: str = "val_loss", higher_is_better: bool = False):
        self.patience, self.metric, self.higher_is_better = patience, metric, higher_is_better
        self.best: float | None = None
        self.evals_since_best = 0

    def update(self, value: float | None) -> bool:
        """Record an evaluation of the metric (None: none this step). Returns whether it is a new best."""
        if value is None:
            return False
        better = self.best is None or (value > self.best if self.higher_is_better else value < self.best)
        if better:
            self.best, self.evals_since_best = value, 0
            return True
        self.evals_since_best += 1
        return False

    @property
    def best_val_loss(self) -> float | None:
        """The best validation loss, when val_loss is the metric."""
        return self.best if self.metric == "val_loss" else None

    @property
    def should_stop(self) -> bool:
        return self.patience > 0 and self.evals_since_best >= self.patience

    def state_dict(self) -> dict[str, Any]:
        # `best_val_loss` keeps the name checkpoints have always used for the val-loss case.
        key = "best_val_loss" if self.metric == "val_loss" else "best_metric_value"
        return {key: self.best, "best_metric": self.metric, "evals_since_best": self.evals_since_best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("best_metric", "val_loss") != self.metric:
            return  # another metric now picks the best checkpoint: start its record afresh
        self.best = state.get("best_val_loss" if self.metric == "val_loss" else "best_metric_value")
        self.evals_since_best = state.get("evals_since_best", 0)


class TaskEvaluator:
    """Task scores (gptforge.eval) every `interval` steps and at `max_steps`, as
    {"eval/<task>/<metric>": value} to merge into the metrics row.

    `score()` runs `evaluate_tasks` on the model; it has no state to checkpoint.
    """

    def __init__(self, score: Callable[[], dict[str, float]], interval: int, max_steps: int, enabled: bool):
        self.score, self.interval, self.max_steps = score, interval, max_steps
        self.enabled = enabled and interval > 0

    def maybe_evaluate(self, step: int) -> dict[str, float]:
        if not self.enabled or not (step % self.interval == 0 or step == self.max_steps):
            return {}
        return self.score()


class Checkpointer:
    """Writes checkpoints through the engine (`engine.save`), under RUN_DIR/checkpoints, and
    restores them: the one place a run's state is saved and reloaded.

    A checkpoint is written at every `interval` steps (0: never on schedule), at a new best, at
    the last step, on early stopping, on a signal and at `stop_at_step`. A bad (non-finite) step
    is never checkpointed on schedule, so a run in a bad streak keeps its last good `latest`.

    The trainer's stateful components are registered with it (`register`, into
    gptforge.train.state.StateRegistry); `maybe_save` saves them all and `restore` reloads them
    all, for --resume and for a spike rollback alike.
    """

    def __init__(self, engine, ckpt_root: Path, config_yaml: str, interval: int, keep: int,
                 data_state: Callable[[int], dict], on_save: Callable[[int, Path], None] | None, is_main: bool):
        self.engine, self.ckpt_root, self.config_yaml = engine, ckpt_root, config_yaml
        self.interval, self.keep, self.data_state = interval, keep, data_state
        self.on_save, self.is_main = on_save, is_main
        self.state = StateRegistry()

    def register(self, key: str | None, component: Stateful, *, on_rollback: bool = True) -> None:
        """Save `component` in every checkpoint and reload it on restore (see StateRegistry.register)."""
        self.state.register(key, component, on_rollback=on_rollback)

    def maybe_save(self, step: int, *, best: bool, bad: bool, force: bool) -> Path | None:
        """Save when this step is a checkpoint step (see the class docstring); returns the folder."""
        periodic = self.interval > 0 and step % self.interval == 0 and not bad
        if not (best or periodic or force):
            return None
        st = dict(self.state.state_dict(), data=self.data_state(step))
        path = self.engine.save(self.ckpt_root, step, st, self.config_yaml, keep=self.keep, best=best)
        if self.on_save is not None and self.is_main:
            self.on_save(step, path)
        return path

    def restore(self, found: Path, *, rollback: bool = False) -> tuple[dict[str, Any], list[Path]]:
        """Reload checkpoint folder `found`: the engine's model, optimizer and RNG states, then every
        registered component (on a rollback only those registered with on_rollback). On the main
        rank, removes the step folders newer than it (of a damaged or abandoned history).

        Returns: (trainer_state.pt as loaded, the step folders removed).

        Raises:
            ValueError: the engine cannot load it (e.g. written by another backend).
        """
        from gptforge.runtime import checkpoint as ckpt_lib

        loaded = self.engine.load(found)
        removed = ckpt_lib.discard_newer(self.ckpt_root, int(loaded.get("step", 0))) if self.is_main else []
        self.state.load_state_dict(loaded, rollback=rollback)
        return loaded, list(removed)


class MetricsLogger:
    """Rows to metrics.jsonl / TensorBoard every `log_interval` steps (and on eval and last steps),
    the progress line after every step, and messages above it."""

    def __init__(self, writer, bar, log_interval: int, max_steps: int, extra_sinks: list | None = None,
                 mfu_label: str = "mfu", has_peak: bool = True):
        self.last_sources = ""  # a mixture's per-source val losses of the last evaluation
        self.writer, self.bar, self.log_interval, self.max_steps = writer, bar, log_interval, max_steps
        # A CPU's peak is measured, not a datasheet figure: its MFU is labelled an estimate.
        self.mfu_label, self.has_peak = mfu_label, has_peak
        self.sinks = [writer, *(extra_sinks or [])]  # each has log(row) or write(row)
        self.history: list[dict[str, Any]] = []

    def log(self, row: dict[str, Any], force: bool = False) -> None:
        step = row["step"]
        if force or step % self.log_interval == 0 or step == self.max_steps or "val_loss" in row:
            for sink in self.sinks:
                (sink.write if hasattr(sink, "write") else sink.log)(row)
        self.history.append(row)

    def progress(self, row: dict[str, Any], last_val: float | None) -> None:
        info = f"loss {row['loss']:.4f} lr {row['lr']:.2e} {row['tokens_per_second']:,.0f} tok/s"
        if row.get("mfu") is not None:
            info += f" {self.mfu_label} {100 * row['mfu']:.1f}%"
        elif self.has_peak:
            info += f" {self.mfu_label} n/a (peak unreliable)"
        if last_val is not None:
            info += f" val {last_val:.4f}"
        if last_val is not None and row.get("val_loss") is not None:  # a mixture's sources, at each evaluation
            self.last_sources = " ".join(f"{k[4:-5]} {v:.3f}" for k, v in row.items()
                                         if k.startswith("val/") and k.endswith("/loss"))
        if self.last_sources:
            info += f" ({self.last_sources})"
        self.bar.update(row["step"], info)

    def message(self, text: str) -> None:
        self.bar.log(text)

    def close(self) -> None:
        self.bar.close()
        self.writer.close()


class NullWriter:
    """Ranks other than 0 write no metrics."""

    def write(self, row: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass
