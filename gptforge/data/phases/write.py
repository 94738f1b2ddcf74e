"""Phase 5, write: the encoded arrays -> the shard folder (`ShardWriter`), with report.json/.html.

The per-shard token arrays are appended to the split files in shard order (windows in window
order), so the output is byte-identical whatever the number of workers. The report is written
into the folder before it is moved into place, with the output recounted from the files written.

Inputs: the encode phase's `Encoded`, the tokenizer, `Splits`, meta.json's `prepare_config` and
`ReportInputs` (what the earlier phases counted). Output: meta.json's content and the report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from gptforge.data.phases.curate import Curated
from gptforge.data.phases.encode import HIST_EDGES, Encoded
from gptforge.data.phases.split import Splits
from gptforge.data.phases.work import WorkFolder
from gptforge.data.shards import SPLITS, ShardWriter
from gptforge.data.tokenizer import Tokenizer


@dataclass
class ReportInputs:
    """What report.json says beyond the output itself (see `gptforge.data.report.build_report`)."""

    cfg: Any  # the PrepareConfig
    recipe: dict[str, Any]
    files: list[Path]
    shards: list[list[Any]]  # the shard plan
    curated: Curated
    timings: dict[str, float]
    resumed: bool
    t0: float  # perf_counter at the start of prepare


def _report(tmp_dir: Path, meta: dict[str, Any], r: ReportInputs, encoded: Encoded, splits: Splits,
            work: WorkFolder) -> dict[str, Any]:
    from gptforge.data.report import build_report, recount_output

    c = r.curated
    report = build_report(cfg=r.cfg, recipe=r.recipe, files=r.files, shards=len(r.shards), read=c.read,
                          normalize=c.normalize, steps=c.steps, corpus=c.corpus, passes=[p for p, _ in c.passes],
                          encoded=encoded.results, meta=meta, recount=recount_output(tmp_dir, meta),
                          timings=r.timings, seconds=time.perf_counter() - r.t0, hist_edges=HIST_EDGES,
                          resumed=r.resumed, pieces_added=splits.pieces_added)
    # CPU seconds the shards took in their processes (wall time on a shared machine says
    # little): input MB per CPU second is the throughput per core.
    for phase, folder in c.passes:
        if phase in report["throughput"]:
            cpu = sum(work.shard_stats(folder, i).get("cpu_seconds", 0.0) for i in range(len(r.shards)))
            report["throughput"][phase]["shard_cpu_seconds"] = round(cpu, 3)
    report["inputs"]["byte_range_shards"] = sum(isinstance(src, dict) for sh in r.shards for src in sh)
    report["throughput"]["curate"]["processes"] = len({x.get("pid") for x in c.results} - {None})
    # How the tokenize phase was cut up: one task per shard, a big shard one per window.
    tok = report["throughput"].setdefault("tokenize", {})
    tok["tasks"] = encoded.tasks
    tok["windowed_shards"] = sum(len(n) > 1 or ".w" in n[0] for n in encoded.names)
    tok["processes"] = len({p for e in encoded.results for p in e.get("pids", [e.get("pid")]) if p is not None})
    return report


def run_write(out_dir: Path, tokenizer: Tokenizer, encoded: Encoded, splits: Splits, work: WorkFolder,
              max_shard_bytes: int, overwrite: bool, prepare_config: dict[str, Any],
              report_inputs: ReportInputs, extra_files: Callable[[Path], None] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Phase 5 (see the module docstring): (meta.json's content, the report).

    `extra_files(tmp_dir)` writes further files into the output before it is moved into place
    (the quality step's model and scores).

    Raises:
        RuntimeError: the encoded documents do not add up to the curated ones (the work folder
            changed while prepare ran).
    """
    from gptforge.data.report import write_report

    t = time.perf_counter()
    enc = encoded.folder
    holder: dict[str, Any] = {}
    with ShardWriter(out_dir, tokenizer, max_shard_bytes=max_shard_bytes, overwrite=overwrite) as writer:
        for shard_names in encoded.names:
            for n in shard_names:
                e = work.read_json(enc / f"{n}.json")
                for split in SPLITS:
                    c = e["splits"][split]
                    if c["tokens"]:
                        writer.write(split, np.load(enc / f"{n}.{split}.npy"), c["documents"], c["bytes"])
        written = sum(writer.splits[s]["documents"] for s in SPLITS)
        if written != splits.curated + splits.pieces_added:
            raise RuntimeError(f"the work folder changed while prepare ran: {splits.curated} documents curated, "
                               f"{written} encoded; delete {work.root} and run prepare again")

        def add_report(tmp_dir: Path, meta: dict[str, Any]) -> None:
            if extra_files is not None:
                extra_files(tmp_dir)
            report_inputs.timings["write"] = time.perf_counter() - t
            holder["report"] = _report(tmp_dir, meta, report_inputs, encoded, splits, work)
            write_report(tmp_dir, holder["report"])

        meta = writer.finish(prepare_config=prepare_config, before_move=add_report)
    return meta, holder.get("report", {})
