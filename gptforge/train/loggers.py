"""Where per-step metrics go: metrics.jsonl, TensorBoard, and the training progress line."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any


class MetricsWriter:
    """Append one JSON object per logged step to RUN_DIR/metrics.jsonl, and mirror scalars (and
    each of the row's `events`, as text under events/<kind>) to TensorBoard (RUN_DIR/tb) when
    enabled. Each row is flushed so a killed run keeps its rows."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, resume_step: int | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            self._truncate_after(resume_step)
        self.f = open(self.path, "a")
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(Path(run_dir) / "tb"), purge_step=resume_step + 1 if resume_step else None)

    def _truncate_after(self, step: int) -> None:
        # Rows past the checkpoint we resume from were never part of the continued run.
        keep = []
        for line in self.path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill
            if row.get("step", 0) <= step:
                keep.append(line)
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(k + "\n" for k in keep))
        os.replace(tmp, self.path)

    def write(self, row: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        self.f.write(json.dumps(clean) + "\n")
        self.f.flush()
        if self.tb is not None:
            step = row["step"]
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)) and v is not None and math.isfinite(v):
                    # val_loss -> val/loss; a mixture's val/NAME/loss and data/NAME/tokens keep their names.
                    tag = "val/loss" if k == "val_loss" else k if k.startswith(("val/", "data/")) else f"train/{k}"
                    self.tb.add_scalar(tag, v, step)
            for ev in row.get("events") or []:  # alarms, rollbacks, resumes: TensorBoard's Text tab
                self.tb.add_text(f"events/{ev.get('kind', 'event')}", json.dumps(ev), step)

    def close(self) -> None:
        self.f.close()
        if self.tb is not None:
            self.tb.flush()
            self.tb.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All rows of RUN_DIR/metrics.jsonl (a line cut by a kill is skipped)."""
    rows = []
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return rows


def format_seconds(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = int(s)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


class Progress:
    """The training progress line: loss, lr, tokens/s, MFU, elapsed and ETA after each step.

    Its form follows `gptforge.progress.resolved_mode` against stderr (so GPTFORGE_PROGRESS
    chooses it, and a command's --quiet, through `set_quiet`, turns it off): "bar", a live rich bar
    on stderr; "log", a plain `step N/M ...` line on stderr every 5 s and at the last step; "off",
    none. Messages (`log`: spikes, rollbacks, resumes) go to stdout unless `enabled` is False
    (--quiet), whatever the mode (while a bar shows, rich prints them above it).

    Raises:
        ValueError: GPTFORGE_PROGRESS holds something other than auto, bar, log or off.
    """

    PLAIN_EVERY_S = 5.0

    def __init__(self, total_steps: int, start_step: int, enabled: bool = True):
        import sys

        from gptforge.progress import resolved_mode

        self.total, self.enabled = total_steps, enabled
        self.t0, self.start_step = time.time(), start_step
        self._last_plain = 0.0
        self.bar = None
        self.mode = resolved_mode(sys.stderr) if enabled else "off"
        if self.mode == "bar":
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
            from rich.progress import Progress as RichProgress

            self.bar = RichProgress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                    TextColumn("{task.fields[info]}"), console=Console(stderr=True), transient=False)
            self.task = self.bar.add_task("train", total=total_steps, completed=start_step, info="")
            self.bar.start()

    def update(self, step: int, info: str) -> None:
        if self.mode == "off":
            return
        done = step - self.start_step
        elapsed = time.time() - self.t0
        eta = elapsed / done * (self.total - step) if done > 0 else float("nan")
        text = f"{info} | {format_seconds(elapsed)} elapsed, ETA {format_seconds(eta)}"
        if self.bar is not None:
            self.bar.update(self.task, completed=step, info=text)
        elif time.time() - self._last_plain > self.PLAIN_EVERY_S or step == self.total:
            import sys

            self._last_plain = time.time()
            print(f"step {step}/{self.total} {text}", file=sys.stderr, flush=True)

    def log(self, message: str) -> None:
        if self.enabled:  # above a live bar: rich redirects stdout while the bar shows
            print(message, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
