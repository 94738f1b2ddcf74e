"""Weights & Biases logging through the `wandb` package: config, every metrics row, the run report.

    logger = WandbLogger(run_dir, project="gpt", mode="offline", config=config_dict)
    logger.load_state_dict(saved["wandb"])      # on --resume, before the first log: same W&B run
    logger.log(row)                             # each metrics row (numbers only; events as a count)
    logger.log_report(run_dir / "report.html")  # the report as an artifact of type "run-report"
    saved["wandb"] = logger.state_dict()        # in every checkpoint
    logger.finish()

Modes are wandb's: "online" (needs `wandb login` or WANDB_API_KEY), "offline" (writes
RUN_DIR/wandb/offline-run-*/run-ID.wandb with no network; upload later with `wandb sync`),
"disabled" (nothing written). The W&B run starts at the first `log`/`log_report`, so a resumed
run's id, restored by `load_state_dict`, is known by then; wandb's `resume="allow"` continues it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from gptforge.errors import InputError


class WandbLogger:
    """One W&B run per gptforge run (see the module docstring).

    Args:
        run_dir: the gptforge run directory; wandb writes under RUN_DIR/wandb/.
        project, entity, name: W&B project, entity (team or user; None: the default) and run name
            (None: the run directory's name).
        mode: "online", "offline" or "disabled".
        config: the resolved run config (a nested dict), sent once at the start.

    Raises:
        InputError: an unknown mode, or the `wandb` package is not installed.
    """

    def __init__(self, run_dir: str | Path, project: str, entity: str | None = None, name: str | None = None,
                 mode: Literal["online", "offline", "disabled"] = "offline", config: dict[str, Any] | None = None):
        if mode not in ("online", "offline", "disabled"):
            raise InputError(f"train.wandb_mode: {mode!r} is not one of online, offline, disabled")
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise InputError("W&B logging needs the wandb package: pip install wandb "
                             "(or leave train.wandb_project unset)") from None
        self.run_dir, self.project, self.entity = Path(run_dir), project, entity
        self.name = name or Path(run_dir).resolve().name
        self.mode, self.config = mode, config or {}
        self.run_id: str | None = None
        self._run: Any = None  # a wandb Run once started (wandb is imported on first use)
        self.last_step: int | None = None

    @property
    def run(self):
        """The live `wandb.Run`, started on first use."""
        if self._run is None:
            import wandb

            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._run = wandb.init(project=self.project, entity=self.entity, name=self.name, mode=self.mode,
                                   dir=str(self.run_dir), config=self.config, id=self.run_id, resume="allow",
                                   settings=wandb.Settings(silent=True, console="off"))
            self.run_id = self._run.id
        return self._run

    def log(self, row: dict[str, Any]) -> None:
        """Log a metrics row at its `step`: finite numbers as they are (val_loss as val/loss, the
        rest under train/), and the number of events of the step as train/events.

        W&B takes only increasing steps: a row at or before the last logged step (the steps a
        `train.spike_action rollback` trains again) is left out here rather than refused by wandb
        with a warning each; W&B keeps the first pass of those steps, metrics.jsonl both."""
        step = int(row["step"])
        if self.last_step is not None and step <= self.last_step:
            return
        self.last_step = step
        data: dict[str, Any] = {}
        for k, v in row.items():
            if k == "step" or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            data["val/loss" if k == "val_loss" else f"train/{k}"] = v
        if row.get("events"):
            data["train/events"] = len(row["events"])
        if data:
            self.run.log(data, step=step)

    def log_report(self, path: str | Path) -> None:
        """Upload (online) or store (offline) a file, e.g. RUN/report.html, as an artifact of type
        "run-report" named report-RUNID (each call a new version)."""
        import wandb

        path = Path(path)
        art = wandb.Artifact(f"report-{self.run.id}", type="run-report")
        art.add_file(str(path), name=path.name)
        self.run.log_artifact(art)

    def state_dict(self) -> dict[str, Any]:
        """{"run_id": the W&B run id, or None before the run started}."""
        return {"run_id": self.run_id}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the W&B run of `state` (call before the first log).

        Raises:
            RuntimeError: the W&B run already started with another id.
        """
        rid = state.get("run_id")
        if self._run is not None and rid != self.run_id:
            raise RuntimeError(f"WandbLogger: run {self.run_id} already started; load_state_dict must come first")
        self.run_id = rid

    def finish(self) -> None:
        """End the W&B run (flushes offline files)."""
        if self._run is not None:
            self._run.finish()
            self._run = None
