"""Sharded, resumable execution of a curation recipe over the input files.

The input files are cut into shards (consecutive files, about `shard_bytes` of input each; a
larger file is a shard of its own). Shards are processed by N worker processes; every result
is a file in a work folder beside the output (`.<out>.work/`), written under a temporary name
and renamed, and a shard's stats file is written last as its "done" mark. Running the same
command again after a crash or Ctrl-C skips the shards already done. Nothing depends on the
number of workers: a shard's output depends only on its files, and shards are combined in
shard order.

Phases (each a set of per-shard tasks, or a global step over their outputs):

1. `lines` (only with a boilerplate step): read, normalize, run the steps before boilerplate,
   count line document frequencies -> `lines/NNNNN.keys.npy`, `.counts.npy`; merged by hash
   range into `boilerplate.npy`.
2. `curate`: read, normalize, run every per-document step (boilerplate line removal in its
   place) -> the surviving documents `curate/NNNNN.arrow` (Arrow IPC: id, text), their exact
   hashes and MinHash band keys `curate/NNNNN.exact.npy`, `.bands.npy`, and
   `curate/NNNNN.json` (counts per step, drop reasons with examples).
3. `dedup` (global): union-find over exact hashes and one band column at a time (read from the
   shards' memory-mapped key files) -> a drop mask per shard `dedup/NNNNN.npy`, `dedup/done.json`.

Memory: a worker holds one batch of documents and its shard's keys; the dedup step holds one
band column and the union-find array (16 bytes per document), never the text.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

import numpy as np

from gptforge.atomic import atomic_write_json as _atomic_write_json
from gptforge.data.normalize import NormalizeStats, normalize_documents
from gptforge.data.pipeline import Recipe, StepStats, apply_steps, build_recipe
from gptforge.data.readers import Document, ReadStats, read_documents, read_file_range, source_size

log = logging.getLogger("gptforge.data")

#: input bytes per shard (compressed size as stored): the unit of parallel work and of resume.
DEFAULT_SHARD_BYTES = 64 << 20
#: smallest automatic shard: below ~1 MB the per-shard files and fsyncs start to show.
MIN_AUTO_SHARD_BYTES = 1 << 20
#: an automatic shard size aims at this many shards, so that any worker count up to ~16 finds
#: work for every process and the last shards do not leave most of them idle.
AUTO_SHARDS = 64
#: documents per batch for MinHash signatures and Arrow record batches.
BATCH_DOCS = 1024
WORK_FORMAT_VERSION = 3  # 2: FineWeb text simplification and short-document rule in near dedup; 3: byte-range shards


# --------------------------------------------------------------------------------------------
# Atomic files and the work folder
# --------------------------------------------------------------------------------------------


def atomic_write_json(path: Path, obj: Any) -> None:
    _atomic_write_json(path, obj, indent=1)


def atomic_save_npy(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp.npy")
    with open(tmp, "wb") as f:
        np.save(f, array)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def work_dir_for(out_dir: Path) -> Path:
    """The work folder of an output folder: hidden, beside it (so a crash never touches `out`)."""
    return out_dir.parent / f".{out_dir.name}.work"


def open_work_dir(work: Path, fingerprint: dict[str, Any]) -> bool:
    """Create `work`, or reuse it when it was made for the same `fingerprint`.

    A work folder from different inputs or options is deleted first (its results would be
    wrong for this run). Returns True when earlier results are reused.
    """
    marker = work / "fingerprint.json"
    if work.is_dir():
        try:
            old = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            old = None
        if old == fingerprint:
            return True
        log.warning(f"{work}: left by a run with {_fingerprint_difference(old, fingerprint)}; starting over")
        shutil.rmtree(work)
    work.mkdir(parents=True)
    atomic_write_json(marker, fingerprint)
    return False


def _fingerprint_difference(old: Any, new: dict[str, Any]) -> str:
    """What differs between two fingerprints, in words ("other options (vocab_size: 400 -> 300)")."""
    if not isinstance(old, dict):
        return "no readable fingerprint"
    parts = []
    if old.get("work_format_version") != new.get("work_format_version"):
        parts.append("another gptforge version")
    if old.get("files_sha256") != new.get("files_sha256") or old.get("files") != new.get("files"):
        parts.append("other input files (names, sizes or times)")
    a, b = old.get("options") or {}, new.get("options") or {}
    changed = [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b), key=str) if a.get(k) != b.get(k)]
    if changed:
        shown = [c if len(c) < 120 else c[:117] + "..." for c in changed]
        parts.append(f"other options ({'; '.join(shown)})")
    return ", ".join(parts) or "another fingerprint"


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
# Running per-shard tasks in worker processes
# --------------------------------------------------------------------------------------------


class WorkerPool:
    """Worker processes shared by every phase of one run (spawned once, on first need).

    Spawning a worker costs an interpreter start and the imports (~0.5 s per worker, more on a
    loaded machine); one pool per phase paid that three times, which on a small corpus cost as
    much as the work. With `workers` <= 1 no process is started and tasks run in this one.
    Use as a context manager; leaving it shuts the processes down.
    """

    def __init__(self, workers: int, lock_folder: str | Path | None = None):
        self.workers = max(1, int(workers))
        self.lock_folder = str(lock_folder) if lock_folder is not None else None
        self._pool: ProcessPoolExecutor | None = None

    def executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            import multiprocessing as mp

            # spawn: forking a process whose Rust thread pools (tokenizers, rensa) already ran can deadlock.
            self._pool = ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"), initializer=_worker_init,
                                             initargs=(os.getpid(), self.lock_folder))
        return self._pool

    def close(self, cancel: bool = False) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=cancel)
            self._pool = None

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(cancel=exc_type is not None)


def run_tasks(fn: Callable[[dict[str, Any]], dict[str, Any]], tasks: list[dict[str, Any]], done: Callable[[int], bool],
              workers: int | WorkerPool, progress: Any = None, description: str = "") -> None:
    """Run `fn(task)` for every task whose index is not `done`, in `workers` processes.

    `workers` is a count (a pool is made for this call) or a `WorkerPool` shared between calls.
    Each task writes its own result files; this only schedules. Results are not needed in
    order because they are files named by shard index. A Ctrl-C cancels what has not started
    (finished shards stay done for the next run).
    """
    todo = [t for t in tasks if not done(t["index"])]
    bar = progress.add_task(description, total=len(tasks), completed=len(tasks) - len(todo),
                            info=f"{len(tasks) - len(todo)} reused" if len(todo) < len(tasks) else "") if progress else None
    if not todo:
        return
    n = workers.workers if isinstance(workers, WorkerPool) else max(1, int(workers))
    if n <= 1 or len(todo) == 1:
        for t in todo:
            fn(t)
            if bar is not None:
                progress.advance(bar)
        return
    if not isinstance(workers, WorkerPool):
        with WorkerPool(n) as own:
            return run_tasks(fn, tasks, done, own, progress, description)
    pool = workers.executor()
    pending = set()
    it = iter(todo)
    try:
        for t in itertools.islice(it, 2 * n):
            pending.add(pool.submit(fn, t))
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                fut.result()
                if bar is not None:
                    progress.advance(bar)
                nxt = next(it, None)
                if nxt is not None:
                    pending.add(pool.submit(fn, nxt))
    except BaseException:
        for fut in pending:
            fut.cancel()
        raise


#: seconds between a worker's checks that its parent still lives (where no parent-death signal).
WATCHDOG_SECONDS = 1.0


def die_with_parent(parent_pid: int) -> None:
    """End this process as soon as `parent_pid` (its parent) dies, whatever the cause.

    On Linux the kernel sends SIGKILL on the parent's death (prctl PR_SET_PDEATHSIG); elsewhere a
    daemon thread checks the parent pid every `WATCHDOG_SECONDS`. Either way, if the parent is
    already gone when this runs (it died while we started), the process exits at once.
    Without this, `kill -9` of `prepare` left its spawn workers writing into the work folder.
    """
    import signal
    import threading

    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(WATCHDOG_SECONDS)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def _worker_init(parent_pid: int | None = None, lock_folder: str | None = None) -> None:
    if parent_pid is not None:
        die_with_parent(parent_pid)
    if lock_folder is not None:
        from gptforge.runtime.lock import hold_as_helper

        hold_as_helper(lock_folder)
    # Each worker is one core's worth of work; Rust thread pools inside each would oversubscribe.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    logging.getLogger("gptforge.data").setLevel(logging.ERROR)  # the main process reports warnings


# --------------------------------------------------------------------------------------------
# Shard tasks
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


def lines_task(task: dict[str, Any]) -> dict[str, Any]:
    """Phase 1 for one shard: line document frequencies after the steps before boilerplate."""
    from gptforge.data.boilerplate import count_lines

    c0 = time.process_time()
    recipe = build_recipe(task["recipe"])
    assert recipe.boilerplate is not None
    rstats, nstats = ReadStats(quiet=True, strict=task.get("strict", False),
                               encoding=task.get("encoding")), NormalizeStats()
    docs = apply_steps(_read(task, rstats, nstats, recipe), recipe.before)
    keys, counts, n = count_lines((d["text"] for d in docs), recipe.boilerplate.min_line_chars)
    out = Path(task["work"]) / "lines"
    i = task["index"]
    atomic_save_npy(out / f"{i:05d}.keys.npy", keys)
    atomic_save_npy(out / f"{i:05d}.counts.npy", counts)
    result = {"documents": n, "cpu_seconds": time.process_time() - c0}
    atomic_write_json(out / f"{i:05d}.json", result)
    return result


def curate_task(task: dict[str, Any]) -> dict[str, Any]:
    """Phase 2 for one shard: every per-document step; write survivors, dedup keys and stats."""
    import pyarrow as pa

    from gptforge.data.boilerplate import BoilerplateLines
    from gptforge.data.dedup import band_hashes, exact_hash, minhash_signatures

    t0, c0 = time.perf_counter(), time.process_time()
    recipe = build_recipe(task["recipe"])
    work = Path(task["work"])
    i = task["index"]
    rstats, nstats = ReadStats(quiet=task.get("quiet", True), strict=task.get("strict", False),
                               encoding=task.get("encoding")), NormalizeStats()
    chain = list(recipe.before)
    if recipe.boilerplate is not None:
        keys = np.load(work / "boilerplate.npy")
        chain.append(BoilerplateLines(frozenset(int(k) for k in keys), recipe.boilerplate.min_line_chars))
    chain += recipe.after
    stats = [StepStats(s.name) for s in chain]
    docs = apply_steps(_read(task, rstats, nstats, recipe), chain, stats)

    dedup = recipe.dedup
    schema = pa.schema([("id", pa.string()), ("text", pa.large_string())])
    out = work / "curate"
    tmp = out / f".{i:05d}.arrow.{uuid.uuid4().hex[:8]}.tmp"
    exact: list[int] = []
    bands: list[np.ndarray] = []
    n_out = chars_out = 0
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        while True:
            batch = list(itertools.islice(docs, BATCH_DOCS))
            if not batch:
                break
            texts = [d["text"] for d in batch]
            n_out += len(batch)
            chars_out += sum(map(len, texts))
            writer.write_batch(pa.record_batch([pa.array([d["id"] for d in batch], pa.string()),
                                                pa.array(texts, pa.large_string())], schema=schema))
            if dedup is not None and dedup.exact:
                exact.extend(exact_hash(t) for t in texts)
            if dedup is not None and dedup.near:
                sig = minhash_signatures(texts, dedup.bands * dedup.rows, dedup.ngram, dedup.seed,
                                         dedup.simplify, dedup.skip_short)
                bands.append(band_hashes(sig, dedup.bands, dedup.rows))
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, out / f"{i:05d}.arrow")
    if dedup is not None:
        atomic_save_npy(out / f"{i:05d}.exact.npy", np.array(exact, dtype=np.uint64))
        width = dedup.bands if dedup.near else 0
        atomic_save_npy(out / f"{i:05d}.bands.npy",
                        np.concatenate(bands) if bands else np.zeros((0, width), np.uint64))
    result = {
        "index": i,
        "read": rstats.to_dict(),
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
    atomic_write_json(out / f"{i:05d}.json", result)
    return result


def shard_documents(work: Path, index: int, mask: np.ndarray | None = None,
                    columns: Sequence[str] = ("id", "text")) -> Iterator[tuple[int, dict[str, Any]]]:
    """(position in shard, {column: value}) of a curated shard's documents not dropped by `mask`."""
    import pyarrow as pa

    with pa.memory_map(str(work / "curate" / f"{index:05d}.arrow")) as source:
        reader = pa.ipc.open_file(source)
        pos = 0
        for b in range(reader.num_record_batches):
            batch = reader.get_batch(b).select(list(columns))
            cols = [batch.column(c).to_pylist() for c in range(len(columns))]
            for j in range(batch.num_rows):
                if mask is None or not mask[pos]:
                    yield pos, {c: cols[k][j] for k, c in enumerate(columns)}
                pos += 1


# --------------------------------------------------------------------------------------------
# Global dedup
# --------------------------------------------------------------------------------------------


def global_dedup(work: Path, n_shards: int, recipe: Recipe) -> dict[str, Any]:
    """Drop masks for exact and near duplicates over all shards, keeping the first of each cluster.

    The kept document of a cluster is the one with the smallest global position (shard order,
    then position in shard), so the result does not depend on the worker count. Writes
    `dedup/NNNNN.npy` (bool drop mask per shard) and `dedup/done.json` (stats); returns the stats.
    """
    from gptforge.data.dedup import UnionFind, cluster_sizes, union_equal_keys


    assert recipe.dedup is not None
    cfg = recipe.dedup
    out = work / "dedup"
    out.mkdir(exist_ok=True)
    cur = work / "curate"
    counts = [int(json.loads((cur / f"{i:05d}.json").read_text())["documents_out"]) for i in range(n_shards)]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    n = int(offsets[-1])
    uf = UnionFind(n)
    exact_edges = near_edges = 0
    if cfg.exact and n:
        exact = np.concatenate([np.load(cur / f"{i:05d}.exact.npy") for i in range(n_shards)])
        exact_edges = union_equal_keys(uf, exact)
        del exact
    exact_roots = uf.roots() if n else np.zeros(0, np.int64)
    if cfg.near and n:
        maps = [np.load(cur / f"{i:05d}.bands.npy", mmap_mode="r") for i in range(n_shards)]
        for b in range(cfg.bands):
            column = np.concatenate([np.asarray(m[:, b]) for m in maps])
            near_edges += union_equal_keys(uf, column, bands=True)
    roots = uf.roots() if n else np.zeros(0, np.int64)
    idx = np.arange(n)
    drop = roots != idx
    exact_dup = exact_roots != idx
    stats = StepStats("dedup")
    stats.documents_in = n
    stats.documents_out = int((~drop).sum())
    # Examples: the first few dropped documents of each kind, with the id of the one kept.
    reasons = np.where(exact_dup, 1, np.where(drop, 2, 0))
    for i in range(n_shards):
        atomic_save_npy(out / f"{i:05d}.npy", drop[offsets[i]:offsets[i + 1]])
    want = {1: "exact_duplicate", 2: "near_duplicate"}
    for code, reason in want.items():
        stats.dropped[reason] = int((reasons == code).sum())
    example_pos = sorted(int(p) for code in want for p in np.flatnonzero(reasons == code)[:3])
    needed = {int(p) for p in example_pos} | {int(roots[p]) for p in example_pos}
    ids = _texts_at(work, offsets, needed)
    for p in example_pos:
        reason = want[int(reasons[p])]
        stats.add_example(reason, f"[{ids[p][0]} duplicates {ids[int(roots[p])][0]}] {ids[p][1]}")
    chars_in = chars_out = 0
    for i in range(n_shards):
        mask = drop[offsets[i]:offsets[i + 1]]
        lens = _text_lengths(work, i)
        chars_in += int(lens.sum())
        chars_out += int(lens[~mask].sum())
    stats.characters_in, stats.characters_out = chars_in, chars_out
    result = {"step": stats.to_dict(), "cluster_sizes": {str(k): v for k, v in cluster_sizes(roots).items()},
              "exact_candidate_pairs": exact_edges, "near_candidate_pairs": near_edges, "documents": n}
    atomic_write_json(out / "done.json", result)
    return result


def _text_lengths(work: Path, index: int) -> np.ndarray:
    """Characters of each document of a curated shard, shape (documents,)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    with pa.memory_map(str(work / "curate" / f"{index:05d}.arrow")) as source:
        table = pa.ipc.open_file(source).read_all()
        if table.num_rows == 0:
            return np.zeros(0, np.int64)
        return pc.utf8_length(table.column("text")).to_numpy(zero_copy_only=False).astype(np.int64)


def _texts_at(work: Path, offsets: np.ndarray, positions: set[int]) -> dict[int, tuple[str, str]]:
    """{global position: (id, text)} for a few documents."""
    found: dict[int, tuple[str, str]] = {}
    for p in sorted(positions):
        shard = int(np.searchsorted(offsets, p, side="right") - 1)
        for pos, d in shard_documents(work, shard):
            if pos == p - offsets[shard]:
                found[p] = (d["id"], d["text"])
                break
    return found


def fingerprint_of(files: Sequence[Path], options: dict[str, Any]) -> dict[str, Any]:
    """What the work folder's results depend on: the files (name, size, mtime) and options."""
    h = hashlib.sha256()
    for f in files:
        h.update(str(f).encode("utf-8", "surrogatepass"))
        try:
            st = os.stat(f)
            h.update(f"\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(b"\0-\n")
    return {"work_format_version": WORK_FORMAT_VERSION, "files_sha256": h.hexdigest(), "files": len(files),
            "options": options}
