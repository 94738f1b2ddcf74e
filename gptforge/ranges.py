"""Numeric ranges of dataclass fields: `bounded` declares a field's allowed range in its metadata,
`out_of_range` is the one check, used for command options (`gptforge.options.check_ranges`) and
config keys (`gptforge.config.TrainConfig.check_values`) alike."""

from __future__ import annotations

import dataclasses
import math
from typing import Any


def bounded(default: Any = None, low: float | None = None, high: float | None = None,
            low_open: bool = False, high_open: bool = False) -> Any:
    """A dataclass field whose value (when not None) must lie in [low, high] (low excluded with
    low_open, high with high_open; None: no bound). `parse_command` refuses a value outside,
    naming the option and the range; --help shows the range.

        stride: Optional[int] = bounded(None, low=1)
    """
    return dataclasses.field(default=default, metadata={"range": (low, high, low_open, high_open)})


def range_text(low: float | None, high: float | None, low_open: bool = False, high_open: bool = False) -> str:
    """'>= 1', '> 0', '< 1', 'in (0, 1]', 'in [0, 1)' for a `bounded` field's range."""
    if high is None:
        return f"{'>' if low_open else '>='} {low}"
    if low is None:
        return f"{'<' if high_open else '<='} {high}"
    return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"


def out_of_range(opts: Any) -> tuple[str, Any, str] | None:
    """(field name, value, allowed range text) of the first `bounded` field of dataclass instance
    `opts` whose value (when not None) lies outside its range or is not finite, or None. The one range check of
    command options (`check_ranges`) and of config keys (`TrainConfig.check_values`)."""
    for f in dataclasses.fields(opts):
        if "range" not in f.metadata:
            continue
        value = getattr(opts, f.name)
        if value is None:
            continue
        low, high, low_open, high_open = f.metadata["range"]
        if isinstance(value, float) and not math.isfinite(value):  # "1e400" parses as inf
            return f.name, value, range_text(low, high, low_open, high_open) + " (a finite number)"
        below = low is not None and (value <= low if low_open else value < low)
        above = high is not None and (value >= high if high_open else value > high)
        if below or above:
            return f.name, value, range_text(low, high, low_open, high_open)
    return None
