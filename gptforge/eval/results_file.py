"""results.json that keeps what earlier `gptforge evaluate` calls wrote.

Each call of `gptforge evaluate --tasks` / `--harness` records its results with `record_results`:

- `results.json` (the path given) is merged, not replaced: its top-level fields describe the
  latest call, and its per-task sections (`tasks` for task files; `results`, `n-shot`,
  `n-samples`, `higher_is_better` for lm-eval) hold every task ever evaluated, the latest result
  of each. Every task entry carries `evaluated_at` (UTC, ISO 8601) and the `checkpoint` and
  `checkpoint_sha256` it was scored with, so a result from an older checkpoint says so.
  `aggregate` and `contamination` are the latest call's (over its tasks).
- `results.history.jsonl` beside it gets one line per call: that call's document, unmerged,
  with its `evaluated_at`. Nothing is ever removed from it.

The run report reads `eval/**/*.json`, so it shows the merged table; the history is .jsonl and
is left out of it.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Any

from gptforge.atomic import atomic_write_json
from gptforge.errors import DamagedFileError

TASK_SECTIONS = ("tasks", "results", "n-shot", "n-samples", "higher_is_better")
"""Top-level keys whose values are {task name: ...}: merged task by task."""


def utc_now() -> str:
    """The current time, UTC, ISO 8601 with seconds (``2026-12-01T12:54:57Z``)."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def history_path(path: str | Path) -> Path:
    """`results.json` -> `results.history.jsonl` (same folder)."""
    path = Path(path)
    return path.with_name(path.stem + ".history.jsonl")


def _stamp(section: dict, when: str | None, checkpoint: Any, sha: Any) -> dict:
    """Each dict entry of `section` with evaluated_at / checkpoint / checkpoint_sha256 set where absent."""
    out = {}
    for name, entry in section.items():
        if isinstance(entry, dict):
            entry = dict(entry)
            for k, v in (("evaluated_at", when), ("checkpoint", checkpoint), ("checkpoint_sha256", sha)):
                entry.setdefault(k, v)
        out[name] = entry
    return out


def merge_results(old: dict | None, new: dict, when: str) -> dict:
    """The results.json document after a call that produced `new` at time `when` (see module docstring).

    A task in both keeps `new`'s entry; tasks only in `old` keep theirs (stamped with `old`'s
    checkpoint and time when they had none).
    """
    merged = dict(new, evaluated_at=when)
    for sec in TASK_SECTIONS:
        fresh = new.get(sec)
        if isinstance(fresh, dict):
            fresh = _stamp(fresh, when, new.get("checkpoint"), new.get("checkpoint_sha256"))
        before = old.get(sec) if isinstance(old, dict) else None
        if isinstance(before, dict):
            before = _stamp(before, old.get("evaluated_at"), old.get("checkpoint"), old.get("checkpoint_sha256"))
            merged[sec] = {**before, **(fresh or {})}
        elif fresh is not None:
            merged[sec] = fresh
    return merged


def read_results(path: str | Path) -> dict | None:
    """The JSON object in `path`, or None when there is no file.

    Raises:
        DamagedFileError: the file is not a JSON object (it was edited by hand or is not ours).
    """
    path = Path(path)
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DamagedFileError(f"{path}: not valid JSON ({e}); move it away or give another --out "
                               f"(earlier calls' results are also in {history_path(path).name})") from None
    if not isinstance(doc, dict):
        raise DamagedFileError(f"{path}: expected a JSON object of evaluation results; move it away or give "
                               "another --out")
    return doc


def record_results(path: str | Path, doc: dict, when: str | None = None) -> dict:
    """Merge `doc` (one call's results) into `path` atomically and append it to the history file.

    Returns: the merged document written to `path`.

    Raises:
        DamagedFileError: `path` exists and is not a JSON object (see `read_results`).
    """
    path = Path(path)
    when = when or utc_now()
    merged = merge_results(read_results(path), doc, when)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, merged)
    line = json.dumps(dict(doc, evaluated_at=when), ensure_ascii=False, default=str) + "\n"
    with open(history_path(path), "a", encoding="utf-8") as fh:  # one write: a crash leaves at most a torn last line
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())
    return merged


def merge_predictions(path: str | Path, predictions: dict) -> dict:
    """{task: predictions} of earlier calls in `path`, updated with `predictions`, written atomically."""
    old = read_results(path) or {}
    merged = {**old, **predictions}
    atomic_write_json(path, merged)
    return merged
