"""Progress of long commands: a rich bar with ETA on a terminal, plain log lines otherwise.

One interface for every long step (prepare's phases, evaluate, export, quantize, prune, the
contamination check, report):

    from gptforge.progress import progress

    with progress("writing gguf tensors", total=len(tensors), unit="tensors") as bar:
        for t in tensors:
            ...
            bar.advance()          # or bar.advance(n); bar.update(completed=k, total=n)

Where it goes depends on the mode (`set_mode`, or the GPTFORGE_PROGRESS environment variable,
which wins):

- ``"auto"`` (default): ``"bar"`` when stderr is a terminal, else ``"log"``.
- ``"bar"``: a rich progress bar on stderr (description, bar, done/total, elapsed, ETA); it
  disappears when done unless ``transient=False``.
- ``"log"``: plain lines on stderr, for CI logs and redirected output: one when the step starts,
  one each time another tenth of the total is done or `LOG_EVERY_S` seconds have passed since
  the last line (whichever comes first), and one when it ends, e.g.
  ``gptforge: writing gguf tensors: 12/40 tensors (30%), 85.1 tensors/s, elapsed 0:00:00, ETA 0:00:00``.
- ``"off"``: nothing (a command's ``--quiet`` selects it through ``set_quiet``).

Several steps shown together (prepare's phases) use `Phases`, whose `add_task` / `advance` /
`update` have the signatures of rich.progress.Progress's.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, TextIO

MODES = ("auto", "bar", "log", "off")
LOG_EVERY_S = 30.0
"""In log mode, the longest wait between two lines of one step (seconds)."""
LOG_EVERY_FRACTION = 0.1
"""In log mode, a line each time this fraction of the total is done."""

_mode = "auto"
_live_bars: list = []  # rich Progress displays now on the terminal, outermost first


def set_mode(mode: str) -> None:
    """Choose where progress goes for this process (see the module docstring).

    Raises:
        ValueError: `mode` is not one of MODES.
    """
    global _mode
    if mode not in MODES:
        raise ValueError(f"progress mode {mode!r}: expected one of {', '.join(MODES)}")
    _mode = mode


def set_quiet(quiet: bool) -> None:
    """A command's ``--quiet``: mode "off" when true, "auto" otherwise (so each call of a command's
    `main` starts from its own options)."""
    set_mode("off" if quiet else "auto")


def resolved_mode(stream: TextIO | None = None) -> str:
    """The mode in effect: "bar", "log" or "off" ("auto" resolved against `stream`, default stderr).

    Raises:
        ValueError: GPTFORGE_PROGRESS holds something other than one of MODES.
    """
    mode = os.environ.get("GPTFORGE_PROGRESS") or _mode
    if mode not in MODES:
        raise ValueError(f"GPTFORGE_PROGRESS={mode!r}: expected one of {', '.join(MODES)}")
    if mode == "auto":
        stream = stream if stream is not None else sys.stderr
        isatty = getattr(stream, "isatty", None)
        return "bar" if isatty is not None and isatty() else "log"
    return mode


def format_duration(seconds: float) -> str:
    """``H:MM:SS`` (the way rich shows elapsed and remaining time)."""
    s = int(max(0.0, seconds) + 0.5)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class _LogTask:
    """One step's plain-line reporter (log mode)."""

    def __init__(self, description: str, total: float | None, unit: str, completed: float, info: str,
                 stream: TextIO, every_s: float, every_fraction: float):
        self.description, self.total, self.unit, self.info = description, total, unit, info
        self.completed = self.start_completed = completed
        self.stream, self.every_s, self.every_fraction = stream, every_s, every_fraction
        self.t0 = self.last_t = time.monotonic()
        self.last_step = self._step()
        self.finished = False
        self._write("started" if not completed else None)

    def _step(self) -> int:
        if not self.total or self.every_fraction <= 0:
            return 0
        return int(self.completed / self.total / self.every_fraction + 1e-9)

    def line(self, note: str | None = None) -> str:
        """The text of one log line for the current state."""
        elapsed = time.monotonic() - self.t0
        done = self.completed - self.start_completed
        rate = done / elapsed if elapsed > 0 else 0.0
        unit = f" {self.unit}" if self.unit else ""
        parts = [f"{_num(self.completed)}/{_num(self.total)}{unit} ({self.completed / self.total:.0%})"
                 if self.total else f"{_num(self.completed)}{unit}"]
        if rate > 0:
            shown = f"{rate:,.0f}" if rate >= 100 else f"{rate:.1f}" if rate >= 1 else f"{rate:.3g}"
            parts.append(f"{shown}{unit or ' it'}/s")
        parts.append(f"elapsed {format_duration(elapsed)}")
        if self.total and not self.finished:
            left = max(0.0, self.total - self.completed)
            parts.append(f"ETA {format_duration(left / rate)}" if rate > 0 else "ETA unknown")
        if note:
            parts.append(note)
        if self.info and not self.finished:  # what the step is doing now; nothing once it is done
            parts.append(self.info)
        return f"gptforge: {self.description}: " + ", ".join(parts)

    def _write(self, note: str | None = None) -> None:
        print(self.line(note), file=self.stream, flush=True)
        self.last_t = time.monotonic()

    def update(self, completed: float | None = None, advance: float = 0, total: float | None = None,
               info: str | None = None, description: str | None = None) -> None:
        if total is not None:
            self.total = total
        new_info = info is not None and info != self.info
        if info is not None:
            self.info = info
        if description is not None:
            self.description = description
        if self.finished:
            return
        self.completed = (self.completed if completed is None else completed) + advance
        if self.total and self.completed >= self.total:
            self.finish()  # all done: the final line now, not when the block ends
            return
        step = self._step()
        if step > self.last_step or new_info or time.monotonic() - self.last_t >= self.every_s:
            self.last_step = step
            self._write()

    def finish(self) -> None:
        if not self.finished:
            self.finished = True
            self._write("done")


def _num(x: float | None) -> str:
    if x is None:
        return "?"
    return f"{int(x):,}" if float(x).is_integer() else f"{x:,.1f}"


class Phases:
    """Several steps shown together, with rich.progress.Progress's task interface.

    Use as a context manager; `add_task` returns an id for `advance` / `update`. Extra keyword
    fields of `add_task` / `update` other than ``info`` (text shown after the counts) are ignored.

    Args:
        enabled: False shows nothing whatever the mode (a library function's ``progress=False``).
        transient: bar mode: remove the bars when done (True) or leave them on the screen.
        stream: where to write (default stderr); also what "auto" tests for a terminal.
        mode: force "bar", "log" or "off" instead of the process-wide mode.
        every_s, every_fraction: log mode's spacing (default LOG_EVERY_S, LOG_EVERY_FRACTION).
        unit: the unit of steps added without one.

    Log mode writes a step's final line when its count reaches its total (or when the block
    ends without an error); a step whose block ends with an error writes no final line, so the
    error stays the last line. A `Phases` opened while a bar is on the terminal adds its rows to
    that display (rich allows one live display at a time).
    """

    def __init__(self, enabled: bool = True, transient: bool = True, stream: TextIO | None = None,
                 mode: str | None = None, every_s: float | None = None, every_fraction: float | None = None,
                 unit: str = ""):
        self.stream = stream if stream is not None else sys.stderr
        if mode is not None and mode not in MODES:
            raise ValueError(f"progress mode {mode!r}: expected one of {', '.join(MODES)}")
        self.mode = "off" if not enabled else (resolved_mode(self.stream) if mode in (None, "auto") else mode)
        self.transient, self.unit = transient, unit
        self.every_s = LOG_EVERY_S if every_s is None else every_s
        self.every_fraction = LOG_EVERY_FRACTION if every_fraction is None else every_fraction
        self._rich: Any = None  # a rich.progress.Progress once shown (rich is imported on first use)
        self._nested = False
        self._own: list[int] = []  # rich task ids this object added (removed from a shared display)
        self._log: dict[int, _LogTask] = {}
        self._units: dict[int, str] = {}
        self._next_id = 0

    def __enter__(self) -> Phases:
        if self.mode == "bar":
            if _live_bars:  # nested inside another step's bars: add rows to the same display
                self._rich = _live_bars[-1]
                self._nested = True
                return self
            from rich.console import Console
            from rich.errors import LiveError
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TextColumn("{task.fields[unit]}"), TextColumn("{task.fields[info]}"),
                           TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                           console=Console(file=self.stream), transient=self.transient)
            try:
                bar.start()
            except LiveError:  # another live display (the trainer's progress line) owns the terminal
                self.mode = "log"
                return self
            self._rich = bar
            _live_bars.append(bar)
        return self

    def __exit__(self, exc_type, *exc: Any) -> None:
        if exc_type is None:  # after an error, its own message is the last line
            for t in self._log.values():
                t.finish()
        if self._rich is not None:
            if self._nested:
                if self.transient:
                    for task_id in self._own:
                        self._rich.remove_task(task_id)
            else:
                _live_bars.remove(self._rich)
                self._rich.stop()
            self._rich = None

    def add_task(self, description: str, total: float | None = None, completed: float = 0, unit: str | None = None,
                 info: str = "", **_fields: Any) -> int:
        """Start a step; returns its id. `total` None: an unknown total (counts and rate, no ETA);
        `unit` None: the Phases' own."""
        unit = self.unit if unit is None else unit
        if self._rich is not None:
            task_id = self._rich.add_task(description, total=total, completed=completed, unit=unit, info=info)
            self._own.append(task_id)
            return task_id
        task_id = self._next_id
        self._next_id += 1
        if self.mode == "log":
            self._log[task_id] = _LogTask(description, total, unit, completed, info, self.stream, self.every_s,
                                          self.every_fraction)
        return task_id

    def advance(self, task_id: int, advance: float = 1) -> None:
        """Count `advance` more units done on step `task_id`."""
        self.update(task_id, advance=advance)

    def update(self, task_id: int, *, completed: float | None = None, advance: float | None = None,
               total: float | None = None, description: str | None = None, info: str | None = None,
               **_fields: Any) -> None:
        """Set the done count (`completed`), add to it (`advance`), or change total / description / info."""
        if self._rich is not None:
            kw = {k: v for k, v in (("completed", completed), ("advance", advance), ("total", total),
                                    ("description", description), ("info", info)) if v is not None}
            self._rich.update(task_id, **kw)
        elif task_id in self._log:
            self._log[task_id].update(completed, advance or 0, total, info, description)

    def finish(self, task_id: int) -> None:
        """End step `task_id` now (log mode: its final line) rather than when the block exits."""
        if task_id in self._log:
            self._log[task_id].finish()


class Bar:
    """The handle `progress` yields: one step of a `Phases`."""

    def __init__(self, phases: Phases, task_id: int):
        self._phases, self._id = phases, task_id

    def advance(self, n: float = 1, info: str | None = None) -> None:
        """Count `n` more units done; `info`: what runs now (shown after the counts)."""
        self._phases.update(self._id, advance=n, info=info)

    def update(self, completed: float | None = None, total: float | None = None, info: str | None = None) -> None:
        """Set the done count, the total, or the text shown after the counts."""
        self._phases.update(self._id, completed=completed, total=total, info=info)


@contextmanager
def progress(description: str, total: float | None = None, unit: str = "it", *, info: str = "",
             enabled: bool = True, transient: bool = True, stream: TextIO | None = None, mode: str | None = None,
             every_s: float | None = None, every_fraction: float | None = None) -> Iterator[Bar]:
    """Show one step's progress while the block runs (see the module docstring for the modes).

    Args:
        description: what is being done ("scoring hellaswag").
        total: units to do (None: unknown; counts and rate without ETA).
        unit: the unit's name, plural ("tensors", "tokens").
        info: what runs first (for a count of steps: the first step's name).
        enabled: False shows nothing whatever the mode.
        every_s, every_fraction: log mode's spacing (default LOG_EVERY_S, LOG_EVERY_FRACTION).

    Yields: a `Bar` with `advance(n, info=)` and `update(completed=, total=, info=)`. In log
    mode a new `info` writes a line too, so a count of named steps shows each step as it starts.
    """
    with Phases(enabled, transient, stream, mode, every_s, every_fraction) as phases:
        yield Bar(phases, phases.add_task(description, total=total, unit=unit, info=info))


def track(items: Iterable, description: str, total: float | None = None, unit: str = "it", **kw: Any) -> Iterator:
    """Yield from `items`, advancing a `progress` step by one per item (total: len(items) when it has one)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with progress(description, total, unit, **kw) as bar:
        for item in items:
            yield item
            bar.advance()
