"""Phase 1, read and curate: input shards -> curated documents, each corpus step's verdict, counts.

The input files are cut into shards (consecutive files, about `shard_bytes` of input each; a
larger file is a shard of its own; a big separated text file, byte ranges). Per shard, in the
workers (`pool.run_tasks`):

1. a key pass for each corpus step that is applied in the chain (boilerplate): read, normalize,
   run the steps before it, and save its keys (`KeyCounter`) -> `NAME_keys/NNNNN.KEY.npy`; then
   its `decide` (main process) -> `NAME/`, `NAME/done.json`;
2. the curation pass: read, normalize, run every per-document step and every earlier corpus
   step's applier -> the surviving documents `curate/NNNNN.arrow` (id, split key, text, language label), the last corpus step's keys
   when it drops by mask (`curate/NNNNN.exact.npy`, `.bands.npy`), and `curate/NNNNN.json`
   (counts per step, drop reasons with examples), written last as the shard's done mark;
3. the mask step's `decide` (dedup: union-find over every shard's keys) -> a drop mask per shard.

Inputs: the recipe, the shard plan, options. Outputs (`Curated`): read/normalize/step counts,
per-shard drop masks, each corpus step's report entry, and the passes' timing names.
Nothing depends on the number of workers: a shard's output depends only on its files, and
shards are combined in shard order. Memory: a worker holds one batch of documents and its
shard's keys; the dedup verdict holds one band column and the union-find array, never the text.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gptforge.data.normalize import NormalizeStats, normalize_documents
from gptforge.data.phases.pool import Executor, run_tasks
from gptforge.data.phases.split import split_key
from gptforge.data.phases.work import WorkFolder
from gptforge.data.pipeline import Recipe, apply_steps, build_recipe
from gptforge.data.readers import Document, ReadStats, read_documents, read_file_range, source_size
from gptforge.data.steps import CorpusStep, DocumentStep, StepStats, step_from_dict

log = logging.getLogger("gptforge.data")

#: input bytes per shard (compressed size as stored): the unit of parallel work and of resume.
DEFAULT_SHARD_BYTES = 64 << 20
#: smallest automatic shard: below ~1 MB the per-shard files and fsyncs start to show.
MIN_AUTO_SHARD_BYTES = 1 << 20
#: an automatic shard size aims at this many shards, so that any worker count up to ~16 finds
#: work for every process and the last shards do not leave most of them idle.
AUTO_SHARDS = 64
#: documents per batch for corpus-step keys and Arrow record batches.
BATCH_DOCS = 1024


def auto_shard_bytes(files: Sequence[Path]) -> int:
    """Shard size for `files`: total / AUTO_SHARDS, within [MIN_AUTO_SHARD_BYTES, DEFAULT_SHARD_BYTES].

    Depends only on the input (never on the worker count), so the shards, and with them the
    resume state, are the same whatever `--workers` says. A 25 MB corpus gets ~25 shards of
    1 MB instead of one 64 MB shard that a single worker would process alone.
    """
    total = sum(source_size(f) for f in files)
    return int(min(DEFAULT_SHARD_BYTES, max(MIN_AUTO_SHARD_BYTES, total // AUTO_SHARDS)))


def plan_shards(files: Sequence[Path], shard_bytes: int = DEFAULT_SHARD_BYTES, doc_separator: str | None = None,
                encoding: str | None = None) -> list[list[str | dict[str, Any]]]:
    """Consecutive files grouped into shards of about `shard_bytes` input bytes each.

    A big uncompressed text file cut into documents by `doc_separator` (more than twice
    `shard_bytes`, see `readers.plan_text_ranges`) is cut into byte ranges of about
    `shard_bytes`, each a shard of its own, given as {"path", "start", "end", "first_piece"}:
    its curation is then shared by the workers, with the documents and ids of a whole reading.
    Depends only on the file list, sizes and contents, never on the worker count.
    """
    from gptforge.data.readers import plan_text_ranges

    shards: list[list[str | dict[str, Any]]] = []
    cur: list[str | dict[str, Any]] = []
    size = 0
    for f in files:
        ranges = plan_text_ranges(Path(f), doc_separator, encoding, shard_bytes)
        if ranges:
            if cur:
                shards.append(cur)
                cur, size = [], 0
            shards.extend([[{"path": str(f), "start": a, "end": b, "first_piece": k}] for a, b, k in ranges])
            continue
        n = source_size(f)
        if cur and size + n > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(str(f))
        size += n
    if cur:
        shards.append(cur)
    return shards


# --------------------------------------------------------------------------------------------
# Shard tasks (run in the workers)
# --------------------------------------------------------------------------------------------


def _read_sources(sources: list[str | dict[str, Any]], rstats: ReadStats, text_field: str,
                  doc_separator: str | None) -> Iterator[Document]:
    """The documents of a shard's files and byte ranges of files (`plan_shards`), in order."""
    for source in sources:
        if isinstance(source, dict):
            yield from read_file_range(Path(source["path"]), rstats, doc_separator or "", source["start"],
                                       source["end"], source["first_piece"])
        else:
            yield from read_documents([], rstats, text_field, files=[Path(source)], doc_separator=doc_separator)


def _read(task: dict[str, Any], rstats: ReadStats, nstats: NormalizeStats, recipe: Recipe) -> Iterator[Document]:
    docs = _read_sources(task["files"], rstats, task["text_field"], task.get("doc_separator"))
    if task.get("limit"):
        docs = itertools.islice(docs, task["limit"])
    return normalize_documents(docs, nstats, form=recipe.normalization or "")


def chain_before(recipe: Recipe, work: WorkFolder, end: int) -> list[DocumentStep]:
    """The per-document steps that run in place of `recipe.chain[:end]`: each corpus step that is
    applied in the chain replaced by its applier (its verdict must be decided), a mask step left out."""
    steps: list[DocumentStep] = []
    for step in recipe.chain[:end]:
        if isinstance(step, CorpusStep):
            applier = step.applier(work)
            if applier is not None:
                steps.append(applier)
        else:
            steps.append(step)
    return steps


def key_pass_folder(step: CorpusStep) -> str:
    return f"{step.name}_keys"


def _batches(docs: Iterator[Document]) -> Iterator[list[Document]]:
    while batch := list(itertools.islice(docs, BATCH_DOCS)):
        yield batch


def key_pass_task(task: dict[str, Any]) -> dict[str, Any]:
    """The key pass of corpus step `task["step"]` (its chain index) over one shard: its keys after
    the steps before it -> `NAME_keys/NNNNN.KEY.npy` and `NNNNN.json` (documents, CPU seconds)."""
    c0 = time.process_time()
    recipe = build_recipe(task["recipe"])
    work = WorkFolder(task["work"])
    step = recipe.chain[task["step"]]
    assert isinstance(step, CorpusStep)
    rstats = ReadStats(quiet=True, strict=task.get("strict", False), encoding=task.get("encoding"))
    docs = apply_steps(_read(task, rstats, NormalizeStats(), recipe), chain_before(recipe, work, task["step"]))
    counter = step.key_counter()
    n = 0
    for batch in _batches(docs):
        n += len(batch)
        counter.add([d.text for d in batch])
    folder, i = key_pass_folder(step), task["index"]
    for key, array in counter.arrays().items():
        work.save_npy(work.shard_file(folder, i, f".{key}.npy"), array)
    result = {"documents": n, "cpu_seconds": time.process_time() - c0}
    work.write_json(work.shard_file(folder, i, ".json"), result)
    return result


def curate_task(task: dict[str, Any]) -> dict[str, Any]:
    """The curation pass over one shard: every step; write survivors, the mask step's keys, counts."""
    import pyarrow as pa

    t0, c0 = time.perf_counter(), time.process_time()
    recipe = build_recipe(task["recipe"])
    work = WorkFolder(task["work"])
    i = task["index"]
    rstats, nstats = ReadStats(quiet=task.get("quiet", True), strict=task.get("strict", False),
                               encoding=task.get("encoding")), NormalizeStats()
    chain = chain_before(recipe, work, len(recipe.chain))
    stats = [StepStats(s.name) for s in chain]
    docs = apply_steps(_read(task, rstats, nstats, recipe), chain, stats)
    mask_step = recipe.mask_step
    counter = mask_step.key_counter() if mask_step is not None else None
    schema = pa.schema([("id", pa.string()), ("key", pa.string()), ("text", pa.large_string()),
                        ("language", pa.string())])
    n_out = chars_out = 0
    with work.arrow_writer(work.curated(i)) as tmp:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            for batch in _batches(docs):
                texts = [d.text for d in batch]
                n_out += len(batch)
                chars_out += sum(map(len, texts))
                writer.write_batch(pa.record_batch([pa.array([d.id for d in batch], pa.string()),
                                                    pa.array([split_key(t) for t in texts], pa.string()),
                                                    pa.array(texts, pa.large_string()),
                                                    pa.array([d.language for d in batch], pa.string())],
                                                   schema=schema))
                if counter is not None:
                    counter.add(texts)
    if counter is not None:
        for key, array in counter.arrays().items():
            work.save_npy(work.shard_file("curate", i, f".{key}.npy"), array)
    result = {
        "index": i,
        "read": rstats.to_dict(),
        "text_fields": dict(rstats.text_fields),
        "warnings": rstats.warnings,
        "normalize": {"documents_in": nstats.documents_in, "documents_out": nstats.documents_out,
                      "characters_out": nstats.characters_out, "dropped": nstats.dropped},
        "steps": [s.to_dict() for s in stats],
        "documents_out": n_out,
        "characters_out": chars_out,
        "seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - c0,  # this process's CPU: what the shard cost on a busy machine
        "pid": os.getpid(),
    }
    work.write_json(work.shard_file("curate", i, ".json"), result)
    return result


# --------------------------------------------------------------------------------------------
# The phase
# --------------------------------------------------------------------------------------------


@dataclass
class Curated:
    """What the read-and-curate phase gives the later phases and the report."""

    read: ReadStats
    normalize: NormalizeStats
    steps: list[StepStats]  # every step in chain order, a mask step's last
    masks: list[np.ndarray | None]  # per shard: documents of curate/NNNNN.arrow to drop (None: keep all)
    corpus: dict[str, dict[str, Any]]  # corpus step name -> its verdict's report entry
    results: list[dict[str, Any]]  # each shard's curate/NNNNN.json
    passes: list[tuple[str, str]] = field(default_factory=list)  # (timing name, work phase) of document passes
    mask_name: str | None = None  # the work folder's step whose drop masks `masks` are (None: no mask)


def _merge_shard_stats(results: list[dict[str, Any]], names: list[str]) -> tuple[ReadStats, NormalizeStats,
                                                                                   list[StepStats]]:
    rstats, nstats = ReadStats(), NormalizeStats()
    steps = [StepStats(n) for n in names]
    for r in results:
        rd = r["read"]
        rstats.merge(ReadStats(files_read=rd["files_read"], documents=rd["documents"], input_bytes=rd["input_bytes"],
                               undecodable_sequences=rd["undecodable_sequences"],
                               documents_with_undecodable=rd["documents_with_undecodable"],
                               files_skipped=dict(rd["files_skipped"]), records_skipped=dict(rd["records_skipped"]),
                               files_truncated=rd["files_truncated"], warnings=list(r.get("warnings", [])),
                               text_fields=dict(r.get("text_fields", {}))))
        nd = r["normalize"]
        nstats.merge(NormalizeStats(nd["documents_in"], nd["documents_out"], nd["characters_out"], dict(nd["dropped"])))
        for st, d in zip(steps, r["steps"], strict=True):
            st.merge(step_from_dict(d))
    return rstats, nstats, steps


def _decided(step: CorpusStep, work: WorkFolder, phase: str, n_shards: int, documents: list[int]) -> dict[str, Any]:
    """`step`'s verdict, decided now from the shards' keys in `phase`, or read back when done."""
    done = work.step_dir(step.name) / "done.json"
    if done.exists():
        return json.loads(done.read_text(encoding="utf-8"))
    names = list(step.key_counter().arrays())
    info = step.decide(work, [work.key_files(phase, i, names) for i in range(n_shards)], documents)
    work.write_json(done, info)
    return info


def run_curate(recipe: Recipe, tasks: list[dict[str, Any]], work: WorkFolder, pool: Executor, progress: Any,
               timings: dict[str, float]) -> Curated:
    """Phase 1 over `tasks` (one per shard, as `curate_task` takes them); fills `timings`."""
    n = len(tasks)
    corpus: dict[str, dict[str, Any]] = {}
    passes: list[tuple[str, str]] = []
    for k, step in enumerate(recipe.chain):
        if not isinstance(step, CorpusStep) or step.drops_by_mask:
            continue
        t, folder = time.perf_counter(), key_pass_folder(step)
        run_tasks(key_pass_task, [{**task, "step": k} for task in tasks], functools.partial(work.shard_done, folder),
                  pool, progress, step.key_pass)
        documents = [work.shard_stats(folder, i)["documents"] for i in range(n)]
        corpus[step.name] = _decided(step, work, folder, n, documents)
        timings[step.key_pass.replace(" ", "_")] = time.perf_counter() - t
        passes.append((step.key_pass.replace(" ", "_"), folder))
    t = time.perf_counter()
    run_tasks(curate_task, tasks, lambda i: work.shard_done("curate", i), pool, progress, "curate")
    timings["curate"] = time.perf_counter() - t
    passes.append(("curate", "curate"))
    results = [work.shard_stats("curate", i) for i in range(n)]
    rstats, nstats, steps = _merge_shard_stats(results, [s.name for s in recipe.chain if s is not recipe.mask_step])
    for w in rstats.warnings[:20]:
        log.warning(w)
    if len(rstats.warnings) > 20:
        log.warning(f"... {sum(rstats.files_skipped.values()) + sum(rstats.records_skipped.values())} "
                    f"skipped files/records in all (see report.json)")
    masks: list[np.ndarray | None] = [None] * n
    mask_step = recipe.mask_step
    if mask_step is not None:
        t = time.perf_counter()
        info = _decided(mask_step, work, "curate", n, [int(r["documents_out"]) for r in results])
        corpus[mask_step.name] = info
        steps.append(step_from_dict(info["step"]))
        masks = [work.drop_mask(mask_step.name, i) for i in range(n)]
        timings[mask_step.name] = time.perf_counter() - t
    return Curated(rstats, nstats, steps, masks, corpus, results, passes,
                   mask_step.name if mask_step is not None else None)
