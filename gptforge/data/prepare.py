"""`prepare`: raw text files -> normalized documents -> train/val/test split -> tokenizer -> shards.

Two streaming passes over the input, so a corpus larger than memory works:

1. scan: read and normalize every document, assign its split (a hash of its id and the seed),
   count, and, unless a tokenizer is given, feed the train split's text to the BPE trainer;
2. encode: read and normalize again, tokenize in parallel worker processes (documents of one
   split go to the workers in batches, results are taken back in submission order, so the
   shards are byte-identical whatever the number of workers) and append to the shard files.

Memory is bounded by the batches in flight (a few MB per worker) plus the BPE trainer's word
counts; no pass holds the corpus.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gptforge.data.normalize import NormalizeStats, normalize_documents
from gptforge.data.readers import Document, ReadStats, expand_inputs, read_documents
from gptforge.data.shards import DEFAULT_MAX_SHARD_BYTES, SPLITS, ShardWriter, check_output_dir, dtype_for_vocab
from gptforge.data.tokenizer import Tokenizer, train_bpe

log = logging.getLogger("gptforge.data")

#: characters of text per batch sent to a tokenizer worker: large enough to amortize the
#: inter-process copy, small enough that workers * 2 batches in flight stay a few tens of MB.
BATCH_CHARS = 1 << 20
BATCH_DOCS = 2048


class EmptyCorpusError(ValueError):
    """No document survived reading and normalization."""


@dataclass
class PrepareConfig:
    """Options of `gptforge prepare` (see `gptforge prepare --help` for each)."""

    inputs: list[str]
    out: str
    vocab_size: int = 32000
    tokenizer: str | None = None
    text_field: str = "text"
    val_fraction: float = 0.01
    test_fraction: float = 0.0
    seed: int = 1337
    workers: int = 0  # 0: all cores
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES
    tokenizer_train_bytes: int = 1_000_000_000  # 0: no limit
    min_frequency: int = 2
    overwrite: bool = False

    def validate(self) -> None:
        """Raise ValueError naming the first invalid option."""
        if not self.inputs:
            raise ValueError("no input given: name at least one file, folder or glob")
        for name in ("val_fraction", "test_fraction"):
            v = getattr(self, name)
            if not 0.0 <= v < 1.0:
                raise ValueError(f"--{name.replace('_', '-')} must be in [0, 1), got {v}")
        if self.val_fraction + self.test_fraction >= 1.0:
            raise ValueError(f"--val-fraction + --test-fraction = {self.val_fraction + self.test_fraction} "
                             f"leaves nothing to train on; keep the sum below 1")
        if self.workers < 0:
            raise ValueError(f"--workers must be >= 0 (0 = all cores), got {self.workers}")
        if self.max_shard_bytes <= 0:
            raise ValueError(f"--max-shard-bytes must be positive, got {self.max_shard_bytes}")
        if self.tokenizer is None and self.vocab_size < 257:
            raise ValueError(f"--vocab-size must be at least 257 (256 bytes + <|endoftext|>), got {self.vocab_size}")

    def meta_dict(self) -> dict[str, Any]:
        """The options that decide the output's content (not out, workers, overwrite), for meta.json."""
        d = asdict(self)
        for key in ("out", "workers", "overwrite"):
            d.pop(key)
        return d


@dataclass
class PrepareResult:
    """What `prepare` wrote and counted."""

    out_dir: Path
    meta: dict[str, Any]
    read: ReadStats
    normalize: NormalizeStats
    seconds: float
    moved_to_split: dict[str, str] = field(default_factory=dict)  # doc id -> split (small-corpus rule)


def split_score(doc_id: str, seed: int) -> float:
    """A uniform number in [0, 1) from BLAKE2b(seed, id): the document's split coordinate."""
    h = hashlib.blake2b(f"{seed}\x00{doc_id}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2.0**64


def assign_split(doc_id: str, seed: int, val_fraction: float, test_fraction: float) -> str:
    """"val" when score < val_fraction, "test" when below val + test fraction, else "train".

    Depends only on (id, seed, fractions): not on reading order or worker count.
    """
    u = split_score(doc_id, seed)
    if u < val_fraction:
        return "val"
    if u < val_fraction + test_fraction:
        return "test"
    return "train"


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


# --------------------------------------------------------------------------------------------
# Tokenization workers
# --------------------------------------------------------------------------------------------

_WORKER_TOKENIZER: Tokenizer | None = None


def _worker_init(tokenizer_json: str) -> None:
    global _WORKER_TOKENIZER
    # Each worker is one core's worth of work; Rust threads inside each would oversubscribe.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER_TOKENIZER = Tokenizer.from_str(tokenizer_json)


def encode_documents(tokenizer: Tokenizer, texts: list[str], dtype: np.dtype) -> tuple[np.ndarray, int]:
    """Token ids of `texts`, each followed by EOS, concatenated; and their UTF-8 byte count.

    Returns (ids of shape (sum of token counts + len(texts),), bytes).
    """
    encoded = tokenizer.encode_batch(texts)
    out = np.empty(sum(map(len, encoded)) + len(encoded), dtype=dtype)
    pos = 0
    eos = tokenizer.eos_id
    for ids in encoded:
        n = len(ids)
        out[pos:pos + n] = ids
        out[pos + n] = eos
        pos += n + 1
    nbytes = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    return out, nbytes


def _worker_encode(texts: list[str], dtype_str: str) -> tuple[np.ndarray, int]:
    assert _WORKER_TOKENIZER is not None
    return encode_documents(_WORKER_TOKENIZER, texts, np.dtype(dtype_str))


# --------------------------------------------------------------------------------------------
# The pipeline
# --------------------------------------------------------------------------------------------


def _documents(files: list[Path], cfg: PrepareConfig, rstats: ReadStats,
               nstats: NormalizeStats) -> Iterator[Document]:
    return normalize_documents(read_documents([], rstats, cfg.text_field, files=files), nstats)


@dataclass
class _Scan:
    documents: dict[str, int] = field(default_factory=lambda: {s: 0 for s in SPLITS})
    lowest_train: list[tuple[float, str]] = field(default_factory=list)  # 2 lowest scores
    tokenizer_bytes: int = 0


def _make_progress(show: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                    disable=not show, transient=False)


def prepare(cfg: PrepareConfig, show_progress: bool = True) -> PrepareResult:
    """Run the whole prepare pipeline (see module docstring) and write the shard folder.

    Raises:
        FileNotFoundError: an input path (or --tokenizer file) does not exist.
        FileExistsError: the output folder exists and is not empty, without `overwrite`.
        EmptyCorpusError: no document left after reading and normalization (the message says
            what was skipped).
        ValueError: an invalid option.
    """
    t0 = time.perf_counter()
    cfg.validate()
    out_dir = Path(cfg.out)
    check_output_dir(out_dir, cfg.overwrite)
    files = expand_inputs(cfg.inputs)
    tokenizer = Tokenizer.from_file(cfg.tokenizer) if cfg.tokenizer else None
    workers = cfg.workers or default_workers()

    rstats, nstats, scan = ReadStats(), NormalizeStats(), _Scan()
    progress = _make_progress(show_progress)
    with progress:
        task = progress.add_task("scan" if tokenizer else "scan + train tokenizer", total=len(files), info="")

        def scanned_train_texts() -> Iterator[str]:
            last_files = -1
            for doc in _documents(files, cfg, rstats, nstats):
                split = assign_split(doc["id"], cfg.seed, cfg.val_fraction, cfg.test_fraction)
                scan.documents[split] += 1
                if split == "train":
                    score = split_score(doc["id"], cfg.seed)
                    if len(scan.lowest_train) < 2 or (score, doc["id"]) < scan.lowest_train[-1]:
                        scan.lowest_train = sorted(scan.lowest_train + [(score, doc["id"])])[:2]
                    if not cfg.tokenizer_train_bytes or scan.tokenizer_bytes < cfg.tokenizer_train_bytes:
                        scan.tokenizer_bytes += len(doc["text"])
                        yield doc["text"]
                done = rstats.files_read + sum(rstats.files_skipped.values())
                if done != last_files:
                    last_files = done
                    progress.update(task, completed=done, info=f"{nstats.documents_out:,} docs")
            progress.update(task, completed=len(files), info=f"{nstats.documents_out:,} docs")

        if tokenizer is None:
            texts = scanned_train_texts()
            first = next(texts, None)
            if first is not None:
                def chained() -> Iterator[str]:
                    yield first
                    yield from texts
                tokenizer = train_bpe(chained(), cfg.vocab_size, min_frequency=cfg.min_frequency)
        else:
            for _ in scanned_train_texts():
                pass

        total_docs = sum(scan.documents.values())
        if total_docs == 0:
            raise EmptyCorpusError(_empty_message(files, rstats, nstats))
        moved = _small_corpus_rule(cfg, scan)
        for doc_id, split in moved.items():
            scan.documents["train"] -= 1
            scan.documents[split] += 1
        if scan.documents["train"] == 0:
            raise EmptyCorpusError(f"no document left for the train split ({total_docs} documents, all in "
                                   f"val/test); lower --val-fraction/--test-fraction or add documents")
        assert tokenizer is not None
        dtype = dtype_for_vocab(tokenizer.vocab_size)

        # ---- pass 2: encode and write ----
        task2 = progress.add_task("tokenize", total=total_docs, info=f"{workers} worker(s)")
        quiet_r, quiet_n = ReadStats(quiet=True), NormalizeStats()
        with ShardWriter(out_dir, tokenizer, max_shard_bytes=cfg.max_shard_bytes, overwrite=cfg.overwrite) as writer:
            pool = None
            if workers > 1:
                import multiprocessing as mp

                # spawn: forking a process whose Rust thread pool already ran can deadlock.
                pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"),
                                           initializer=_worker_init, initargs=(tokenizer.to_str(),))
            try:
                pending: list[tuple[str, int, Future | tuple[np.ndarray, int]]] = []

                def submit(split: str, texts: list[str]) -> None:
                    if pool is None:
                        pending.append((split, len(texts), encode_documents(tokenizer, texts, dtype)))
                    else:
                        pending.append((split, len(texts), pool.submit(_worker_encode, texts, dtype.name)))
                    limit = 2 * workers if pool is not None else 0
                    while len(pending) > limit:
                        drain_one()

                def drain_one() -> None:
                    split, ndocs, fut = pending.pop(0)
                    ids, nbytes = fut.result() if isinstance(fut, Future) else fut
                    writer.write(split, ids, ndocs, nbytes)
                    progress.advance(task2, ndocs)

                buffers: dict[str, list[str]] = {s: [] for s in SPLITS}
                sizes = {s: 0 for s in SPLITS}
                for doc in _documents(files, cfg, quiet_r, quiet_n):
                    split = moved.get(doc["id"]) or assign_split(doc["id"], cfg.seed, cfg.val_fraction, cfg.test_fraction)
                    buffers[split].append(doc["text"])
                    sizes[split] += len(doc["text"])
                    if sizes[split] >= BATCH_CHARS or len(buffers[split]) >= BATCH_DOCS:
                        submit(split, buffers[split])
                        buffers[split], sizes[split] = [], 0
                for split in SPLITS:
                    if buffers[split]:
                        submit(split, buffers[split])
                while pending:
                    drain_one()
            finally:
                if pool is not None:
                    pool.shutdown(cancel_futures=True)
            written = sum(writer.splits[s]["documents"] for s in SPLITS)
            if written != total_docs:
                raise RuntimeError(f"the input changed while prepare ran: {total_docs} documents in the "
                                   f"first pass, {written} in the second; run prepare again")
            meta = writer.finish(prepare_config={**cfg.meta_dict(), "tokenizer_trained": cfg.tokenizer is None,
                                                 "moved_to_val_or_test": sorted(moved)})
    return PrepareResult(out_dir, meta, rstats, nstats, time.perf_counter() - t0, moved)


def _small_corpus_rule(cfg: PrepareConfig, scan: _Scan) -> dict[str, str]:
    """Guarantee one val document (>= 2 docs) and one test document (>= 3 docs) when asked for.

    With few documents, val_fraction * N < 1 can leave val empty; the train documents with the
    lowest split scores move over. Scores depend only on (id, seed), so the rule is as
    order-independent as the split itself.
    """
    moved: dict[str, str] = {}
    total = sum(scan.documents.values())
    candidates = [doc_id for _, doc_id in scan.lowest_train]
    if cfg.val_fraction > 0 and scan.documents["val"] == 0 and total >= 2 and candidates:
        moved[candidates.pop(0)] = "val"
    if cfg.test_fraction > 0 and scan.documents["test"] == 0 and total >= 3 and candidates:
        moved[candidates.pop(0)] = "test"
    return moved


def _empty_message(files: list[Path], rstats: ReadStats, nstats: NormalizeStats) -> str:
    parts = [f"no documents to prepare: {len(files)} file(s) found, {rstats.files_read} read"]
    if rstats.files_skipped:
        parts.append("files skipped: " + ", ".join(f"{v} {k}" for k, v in sorted(rstats.files_skipped.items())))
    if rstats.records_skipped:
        parts.append("records skipped: " + ", ".join(f"{v} {k}" for k, v in sorted(rstats.records_skipped.items())))
    if nstats.dropped:
        parts.append("documents dropped: " + ", ".join(f"{v} {k}" for k, v in sorted(nstats.dropped.items())))
    if rstats.warnings:
        parts.append(f"first warning: {rstats.warnings[0]}")
    return "; ".join(parts)


def summary_rows(result: PrepareResult) -> list[tuple[str, str]]:
    """(label, value) lines of the prepare summary, for printing."""
    r, n, meta = result.read, result.normalize, result.meta
    rows = [
        ("files read", f"{r.files_read:,}" + (f" ({r.files_truncated} truncated, readable part kept)" if r.files_truncated else "")),
    ]
    for reason, count in sorted(r.files_skipped.items()):
        rows.append((f"files skipped: {reason}", f"{count:,}"))
    rows.append(("documents read", f"{n.documents_in:,}"))
    for reason, count in sorted(r.records_skipped.items()):
        rows.append((f"records skipped: {reason}", f"{count:,}"))
    for reason, count in sorted(n.dropped.items()):
        rows.append((f"documents dropped: {reason}", f"{count:,}"))
    if r.undecodable_sequences:
        rows.append(("undecodable byte sequences replaced", f"{r.undecodable_sequences:,} in {r.documents_with_undecodable:,} documents"))
    rows.append(("documents kept", f"{n.documents_out:,}"))
    rows.append(("characters", f"{n.characters_out:,}"))
    rows.append(("tokenizer", f"vocab {meta['vocab_size']:,}, eos id {meta['eos_id']}, {meta['dtype']}, sha256 {meta['tokenizer_sha256'][:12]}"))
    for split in SPLITS:
        s = meta["splits"][split]
        if not s["documents"]:
            continue
        text_tokens = s["tokens"] - s["documents"]
        bpt = s["bytes"] / text_tokens if text_tokens else float("nan")
        rows.append((f"{split}", f"{s['documents']:,} docs, {s['tokens']:,} tokens, {s['bytes']:,} bytes, "
                     f"{bpt:.2f} bytes/token, {len(s['files'])} file(s)"))
    rows.append(("time", f"{result.seconds:.1f} s"))
    return rows
