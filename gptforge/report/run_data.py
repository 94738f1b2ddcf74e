"""What a run report reads from a run directory, and what it found missing or damaged.

A run directory (written by `gptforge pretrain` / `finetune`) holds `config.yaml`,
`metrics.jsonl` (one JSON object per logged step), `tb/` (TensorBoard event files),
`checkpoints/` and optionally `eval/**/*.json` (evaluation results). Nothing here is required:
`load_run` records what is absent in `RunData.missing` so the report can say so and still show
the rest.

Events. A metrics row may carry `"events": [{"kind": ..., ...}]` (for example a loss spike from
`gptforge.train.spikes.SpikeDetector`, or `{"kind": "resume"}`); rows without a `"loss"` key are
event-only rows. Resumes are also found without any event row: every (re)start of the trainer
opens a new TensorBoard event file, so the first step recorded in each event file after the
first one is a resume point.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gptforge.errors import MissingInputError

#: Keys of a metrics row that the report draws in their own charts (anything else numeric goes to
#: "other metrics").
KNOWN_KEYS = {"step", "loss", "lr", "grad_norm", "tokens_per_second", "mfu", "peak_memory_bytes",
              "predicted_memory_bytes", "tokens_seen", "step_seconds", "elapsed_seconds", "skipped", "val_loss",
              "events", "tokens_per_second_rank_min", "tokens_per_second_rank_max", "peak_memory_bytes_rank_min"}


@dataclass
class MetricsFile:
    """The readable rows of a metrics.jsonl, and how many lines could not be read."""

    rows: list[dict[str, Any]]
    bad_lines: int = 0
    """Lines that are not a JSON object (a line cut by a kill, or damage)."""
    last_line_cut: bool = False
    """Whether the unreadable lines include the last one (the usual mark of a killed writer)."""


def read_metrics_file(path: str | Path) -> MetricsFile:
    """Read a metrics.jsonl, skipping (and counting) lines that are not a JSON object.

    Rows are kept in file order; a row whose `step` is not a number is counted as bad.

    Raises:
        MissingInputError: `path` does not exist.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingInputError(f"{path}: no such file")
    rows, bad, last_bad = [], 0, False
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict) or not isinstance(row.get("step"), (int, float)):
            bad += 1
            last_bad = last_bad or i == len(lines) - 1
            continue
        rows.append(row)
    return MetricsFile(rows=rows, bad_lines=bad, last_line_cut=last_bad)


def tensorboard_start_steps(tb_dir: str | Path) -> list[int]:
    """The first step recorded in each TensorBoard event file of `tb_dir`, in file order.

    The trainer opens one event file per (re)start, so every entry after the first marks a
    resume (the step before it is the checkpoint it resumed from). Files without any scalar are
    left out. Returns [] when there is no such folder.
    """
    tb_dir = Path(tb_dir)
    files = list(tb_dir.glob("events.out.tfevents.*")) if tb_dir.is_dir() else []
    # Named events.out.tfevents.<unix seconds>.<host>.<pid>.<n>: order by time, then counter.
    files.sort(key=lambda f: (_int_field(f.name, 3), _int_field(f.name, -1), f.name))
    if not files:
        return []
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    firsts = []
    for f in files:
        for event in EventFileLoader(str(f)).Load():
            if event.HasField("summary") and event.summary.value:
                firsts.append(int(event.step))
                break
    return firsts


def _int_field(name: str, i: int) -> int:
    parts = name.split(".")
    try:
        return int(parts[i])
    except (IndexError, ValueError):
        return 0


@dataclass
class RunData:
    """Everything the report shows about one run."""

    path: Path
    label: str
    config: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    """Step rows (with a `loss`), sorted by step; the last row wins for a repeated step."""
    events: list[dict[str, Any]] = field(default_factory=list)
    """{"step", "kind", ...} from the rows' `events` lists."""
    resumes: list[int] = field(default_factory=list)
    """Steps at which the run was resumed (the first step trained after each restart)."""
    bad_lines: int = 0
    last_line_cut: bool = False
    missing: list[str] = field(default_factory=list)
    """One sentence per missing or unreadable input."""
    eval_results: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """(path relative to the run, parsed JSON) of every eval/**/*.json."""
    data_dir: Path | None = None
    data_meta: dict[str, Any] | None = None
    data_report: dict[str, Any] | None = None

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of the rows whose `key` is a finite number."""
        xs, ys = [], []
        for r in self.rows:
            v = r.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                xs.append(int(r["step"]))
                ys.append(float(v))
        return xs, ys

    def metric_keys(self) -> set[str]:
        """Every key with at least one finite number in the rows."""
        keys = set()
        for r in self.rows:
            for k, v in r.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    keys.add(k)
        return keys


def _resolve_data_dir(run_dir: Path, path: str | None) -> Path | None:
    if not path:
        return None
    p = Path(path)
    for cand in ([p] if p.is_absolute() else [Path.cwd() / p, run_dir.parent / p, run_dir / p]):
        if (cand / "meta.json").is_file():
            return cand.resolve()
    return None


def require_run_dir(run_dir: Path) -> None:
    """Raises MissingInputError when `run_dir` is not a folder."""
    if not run_dir.is_dir():
        raise MissingInputError(f"{run_dir}: no such run directory (give the --out folder of a pretrain/finetune run)")


RUN_FILES = ("metrics.jsonl", "config.yaml", "samples.json", "eval")
"""What a run folder holds that the report can show (any one is enough)."""


def has_run_files(run_dir: Path) -> bool:
    """Whether `run_dir` holds at least one of RUN_FILES."""
    return any((run_dir / name).exists() for name in RUN_FILES)


def load_run(run_dir: str | Path, label: str | None = None) -> RunData:
    """Read what exists of a run directory (see the module docstring).

    Raises:
        MissingInputError: `run_dir` is not a directory.
    """
    run_dir = Path(run_dir)
    require_run_dir(run_dir)
    run = RunData(path=run_dir, label=label or run_dir.resolve().name)
    cfg_path = run_dir / "config.yaml"
    if cfg_path.is_file():
        try:
            loaded = yaml.safe_load(cfg_path.read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            loaded = None
            run.missing.append(f"{cfg_path} could not be read as YAML ({str(e).splitlines()[0]}): the summary "
                               "has no model or data details")
        if isinstance(loaded, dict):
            run.config = loaded
    else:
        run.missing.append(f"{cfg_path} is missing: the summary has no model, data or layout details")

    metrics_path = run_dir / "metrics.jsonl"
    if metrics_path.is_file():
        mf = read_metrics_file(metrics_path)
        run.bad_lines, run.last_line_cut = mf.bad_lines, mf.last_line_cut
        by_step: dict[int, dict[str, Any]] = {}
        for r in mf.rows:
            step = int(r["step"])
            for ev in r.get("events") or []:
                if isinstance(ev, dict):
                    run.events.append({"step": step, **ev})
            if "loss" in r:
                by_step[step] = r
        run.rows = [by_step[s] for s in sorted(by_step)]
        if not run.rows:
            run.missing.append(f"{metrics_path} holds no step rows: there are no curves to draw")
    else:
        run.missing.append(f"{metrics_path} is missing: there are no curves, and the summary has no losses "
                           "(the run did not log a step yet, or this is not a run directory)")

    starts = tensorboard_start_steps(run_dir / "tb")
    run.resumes = sorted(set(starts[1:]) | {int(e["step"]) for e in run.events if e.get("kind") == "resume"})

    eval_dir = run_dir / "eval"
    for p in sorted(eval_dir.rglob("*.json")) if eval_dir.is_dir() else []:
        if p.name.endswith(".predictions.json"):  # per-example predictions of `evaluate`, not scores
            continue
        try:
            run.eval_results.append((str(p.relative_to(run_dir)), json.loads(p.read_text(encoding="utf-8"))))
        except (json.JSONDecodeError, UnicodeDecodeError):
            run.missing.append(f"{p} is not valid JSON: left out of the evaluation table")

    data_path = (run.config.get("data") or {}).get("path") if isinstance(run.config.get("data"), dict) else None
    if (run.config.get("data") or {}).get("sources"):
        data_path = None  # a mixture: its sources are in the mixture table, not one shard folder's report
    run.data_dir = _resolve_data_dir(run_dir, data_path)
    if run.data_dir is not None:
        run.data_meta = json.loads((run.data_dir / "meta.json").read_text(encoding="utf-8"))
        rep = run.data_dir / "report.json"
        if rep.is_file():
            run.data_report = json.loads(rep.read_text(encoding="utf-8"))
    elif data_path and not Path(data_path).is_file():  # a data file (instruction .jsonl) has no shard report
        run.missing.append(f"the prepared data {data_path} (config.yaml data.path) was not found: the data section "
                           "and bits per byte are left out")
    return run
