"""`prepare`: raw text -> curated documents -> train/val/test split -> tokenizer -> shards -> report.

The work is done by input shard (`gptforge.data.curate`), in worker processes, with every
intermediate result in a work folder beside the output so that a killed run resumes:

1. curate: read, normalize and run the recipe's steps over each shard; global boilerplate and
   dedup steps over all shards (see `gptforge.data.curate`);
2. split: each surviving document's split is a hash of its id and the seed; when that leaves
   val (or test) empty (one input.txt is one document), they are cut from the end of the largest
   train document instead, by character position at a line break (`_position_split`);
3. tokenizer: unless one is given, a byte-level BPE is trained on the train split's text;
4. encode: each shard's documents are tokenized in a worker and saved per split; a shard of
   more than 2 * `ENCODE_WINDOW_BYTES` of text (one big file) in byte windows, one task each
   (`gptforge.data.windows`: same tokens);
5. write: the per-shard token arrays are appended to the shard files in shard order, so the
   output is byte-identical whatever the number of workers; `report.json` and `report.html`
   are written beside them, with the output recounted from the files written.

A big uncompressed text file cut by --doc-separator is read in byte ranges (`curate.plan_shards`),
one shard each, so that its curation too is shared by the workers.

Memory is bounded by one shard per worker (a few tens of MB with the default shard size) plus
the BPE trainer's word counts and the dedup step's 16 bytes per document. A single document
larger than that is held whole as text a few times (read, normalized, curated), but tokenized,
counted for the BPE trainer and MinHashed in whitespace-cut pieces of `TOKENIZE_PIECE_CHARS`
(the same tokens and signatures): peak RSS per process stays below `MEMORY_BASE_MB` MB +
`MEMORY_BYTES_PER_CHAR` bytes per character of the largest document (measured on 50 MB
one-line files, recipe default, on a loaded machine: 488 MB in the benchmark, 660-1,080 MB in
the test beside other work (the peak moves with the tokenizer's worker threads), against a bound of
1,450 MB; it was about 150-200 bytes per character before).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gptforge.data.curate import (
    WorkerPool,
    atomic_write_json,
    auto_shard_bytes,
    curate_task,
    fingerprint_of,
    global_dedup,
    lines_task,
    open_work_dir,
    plan_shards,
    run_tasks,
    shard_documents,
    work_dir_for,
)
from gptforge.data.normalize import NormalizeStats
from gptforge.data.pipeline import StepStats, build_recipe, load_recipe, warn_heavy_steps
from gptforge.data.readers import ReadStats, expand_inputs
from gptforge.data.shards import (
    DEFAULT_MAX_SHARD_BYTES,
    SPLITS,
    ShardWriter,
    check_output_dir,
    dtype_for_vocab,
)
from gptforge.data.text_stats import whitespace_pieces
from gptforge.data.tokenizer import Tokenizer, train_bpe
from gptforge.errors import InputError

log = logging.getLogger("gptforge.data")

#: the documented memory bound (see the module docstring), checked by a test on a 50 MB document.
MEMORY_BASE_MB = 250
MEMORY_BYTES_PER_CHAR = 24
#: characters of text per tokenizer call inside an encode worker.
BATCH_CHARS = 1 << 20
BATCH_DOCS = 2048
#: histogram bin edges (characters, tokens): powers of two, fixed so that shards add up.
HIST_EDGES = [0] + [2 ** k for k in range(0, 31)]


class EmptyCorpusError(InputError):
    """No document survived reading, normalization and the recipe (the message names the step)."""


@dataclass
class PrepareConfig:
    """Options of `gptforge prepare` (see `gptforge prepare --help` for each)."""

    inputs: list[str]
    """Files, folders (walked recursively) and glob patterns to read."""
    out: str
    """Shard folder to write (must not exist or be empty, unless --overwrite)."""
    vocab_size: int = 0
    """Vocabulary size of the trained tokenizer, including the 256 byte tokens and <|endoftext|> (a
    small corpus may stop short of it); 0 (the default): 4*sqrt(characters) rounded to a power of
    two, between 512 and 32768 (1 MB of text: 4096), with a warning when a size given is more than
    4x off that; ignored with --tokenizer."""
    tokenizer: str | None = None
    """Use this Hugging Face tokenizer.json (it must have <|endoftext|>) instead of training one."""
    text_field: str = "auto"
    """JSON field / Parquet, CSV or Arrow column holding the document text; auto: the first of text,
    story, content, raw_content that a record has."""
    val_fraction: float = 0.01
    """Fraction of documents in the validation split (at least one document when the corpus has 2+;
    a single document is split by position)."""
    test_fraction: float = 0.0
    """Fraction of documents in the test split (at least one document when > 0 and the corpus has 3+)."""
    seed: int = 1337
    """Seed of the document-id hash that decides each document's split."""
    workers: int = 0
    """Tokenizer worker processes (0: one per available core); the output does not depend on it."""
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES
    """Start a new .bin file once one holds this many bytes (files end at document boundaries)."""
    tokenizer_train_bytes: int = 1_000_000_000
    """Train the tokenizer on at most this many characters of train-split text, in reading order (0: all)."""
    min_frequency: int = 2
    """A byte pair must occur this many times to become a merge in the trained tokenizer."""
    overwrite: bool = False
    """Replace an existing shard folder at --out (only once the new one is complete)."""
    recipe: str = "default"
    """Curation recipe: a built-in (none, default, web, code) or a YAML file; see --show-recipe."""
    doc_separator: str | None = None
    """Split .txt files into documents at this string (e.g. "<|endoftext|>")."""
    limit: int = 0
    """Read only the first N documents (0: all), for trials."""
    strict: bool = False
    """Stop at the first bad file, record or line instead of skipping and counting it."""
    shard_bytes: int = 0
    """Input bytes per work shard (the unit of parallel work and of resume after a crash; 0: the corpus
    size / 64, between 1 MiB and 64 MiB)."""
    keep_work: bool = False
    """Keep the work folder (.OUT.work) after success."""
    languages: list[str] | None = None
    """Keep only documents in these languages (ISO 639 codes, e.g. en zh, or en,zh), detected with the
    bundled fastText lid.176 model; sets (or adds) the recipe's langid step."""
    language_score: float | None = None
    """Minimum language-ID probability with --languages (the recipe's value, else 0.65)."""
    encoding: str | None = None
    """Encoding of text, JSON and CSV files that have no byte-order mark (default UTF-8; UTF-16/32
    files with a BOM are always decoded), e.g. utf-16-le, latin-1, cp1252."""

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
        if self.shard_bytes < 0:
            raise ValueError(f"--shard-bytes must be >= 0 (0 = chosen from the corpus size), got {self.shard_bytes}")
        if self.limit < 0:
            raise ValueError(f"--limit must be >= 0 (0 = no limit), got {self.limit}")
        if self.doc_separator is not None and self.doc_separator == "":
            raise ValueError('--doc-separator "": an empty separator cuts nothing; give the string that ends each '
                             'document (e.g. "<|endoftext|>"), or leave the option out to read each file as one '
                             "document")
        if self.encoding:
            import codecs

            try:
                codecs.lookup(self.encoding)
            except LookupError:
                raise ValueError(f"--encoding {self.encoding!r}: not an encoding Python knows "
                                 f"(e.g. utf-8, utf-16-le, latin-1, cp1252)") from None
        if self.tokenizer is None and self.vocab_size != 0 and self.vocab_size < 257:
            raise ValueError(f"--vocab-size must be at least 257 (256 bytes + <|endoftext|>), or 0 to choose it "
                             f"from the corpus size; got {self.vocab_size}")

    def meta_dict(self) -> dict[str, Any]:
        """The options that decide the output's content (not out, workers, ...), for meta.json."""
        d = asdict(self)
        for key in ("out", "workers", "overwrite", "keep_work"):
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
    steps: list[StepStats] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)
    already_done: bool = False  # the output was complete for these inputs and options: nothing ran


def work_fingerprint(cfg: PrepareConfig, files: list[Path], curate_options: dict[str, Any]) -> dict[str, Any]:
    """The work folder's fingerprint: the input files and every option that changes any output.

    Covers the curation options (`curate_options`: recipe, text field, shard size, ...), and all of
    `PrepareConfig.meta_dict` (vocab size, min frequency, tokenizer training bytes, seed, split
    fractions, shard file size, ...), with a given --tokenizer file by its SHA-256 (its path says
    nothing about its content). Options that never change the output (workers, keep_work) are
    left out, so a rerun with another worker count resumes. A work folder with another
    fingerprint is deleted and the run starts over (`curate.open_work_dir` names what differs).
    """
    options = dict(curate_options)
    for key, value in cfg.meta_dict().items():
        if key not in ("inputs", "tokenizer"):
            options.setdefault(key, value)
    if cfg.tokenizer:
        options["tokenizer_sha256"] = hashlib.sha256(Path(cfg.tokenizer).read_bytes()).hexdigest()
    return fingerprint_of(files, options)


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
# Encoding
# --------------------------------------------------------------------------------------------


#: a text longer than this is tokenized in pieces cut at whitespace (`text_stats.whitespace_pieces`),
#: which gives the same tokens: the tokenizer library keeps ~100 bytes per token of a call's
#: input alive, which made one 200 MB document need 21 GB. (256 KiB: 10 MB of text tokenized
#: in 180 MB peak RSS against 330 MB with 1 MiB pieces, at the same speed.)
TOKENIZE_PIECE_CHARS = 1 << 18


def encode_documents(tokenizer: Tokenizer, texts: list[str], dtype: np.dtype,
                     ends: list[bool] | None = None) -> tuple[np.ndarray, int, np.ndarray]:
    """Token ids of `texts`, each followed by EOS, concatenated; their UTF-8 bytes; tokens per text.

    Texts are tokenized in calls of about `TOKENIZE_PIECE_CHARS` characters (long texts in
    whitespace-cut pieces, identical tokens), so memory does not grow with a document's size
    beyond its ids. `ends[k]` False: text k is not the end of its document (a window of a huge
    one, see `plan_encode_windows`) and gets no EOS.

    Returns (ids of shape (sum of token counts + EOS count,), bytes, lengths (len(texts),) int64
    without the EOS).
    """
    eos = tokenizer.eos_id
    lengths = np.zeros(len(texts), dtype=np.int64)
    chunks: list[np.ndarray] = []
    group: list[str] = []
    owners: list[int] = []  # text index of each piece in `group`; -1 marks an EOS after the piece
    size = 0

    def run() -> None:
        for piece_ids, k in zip(tokenizer.encode_batch(group), owners, strict=True):
            arr = np.asarray(piece_ids, dtype=dtype)
            lengths[abs(k) - 1] += arr.size
            chunks.append(arr)
            if k < 0:
                chunks.append(np.array([eos], dtype=dtype))
        group.clear()
        owners.clear()

    nbytes = 0
    for k, text in enumerate(texts):
        pieces = whitespace_pieces(text, TOKENIZE_PIECE_CHARS) if len(text) > TOKENIZE_PIECE_CHARS else iter([text])
        piece = next(pieces)
        while piece is not None:  # one piece of lookahead: the last one is followed by EOS
            following = next(pieces, None)
            group.append(piece)
            owners.append(-(k + 1) if following is None and (ends is None or ends[k]) else k + 1)
            size += len(piece)
            nbytes += len(piece.encode("utf-8", "surrogatepass"))
            if size >= TOKENIZE_PIECE_CHARS:
                run()
                size = 0
            piece = following
    if group:
        run()
    out = np.concatenate(chunks) if chunks else np.zeros(0, dtype=dtype)
    return out, nbytes, lengths


def histogram(values: np.ndarray) -> list[int]:
    """Counts of `values` in the fixed power-of-two bins `HIST_EDGES` (last bin open-ended)."""
    edges = np.array(HIST_EDGES[1:], dtype=np.int64)
    return np.bincount(np.searchsorted(edges, np.asarray(values, dtype=np.int64), side="right"),
                       minlength=len(HIST_EDGES)).tolist()


def encode_task(task: dict[str, Any]) -> dict[str, Any]:
    """Tokenize one curated shard into per-split id arrays (`ENC/NNNNN.npz`) and counts (`.json`)."""
    from gptforge.data.curate import atomic_save_npy

    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    work, i = Path(task["work"]), task.get("shard", task["index"])
    out = Path(task["out"])
    name = task.get("name", f"{i:05d}")
    tokenizer = Tokenizer.from_file(task["tokenizer"], task.get("eos_token"))
    dtype = np.dtype(task["dtype"])
    mask = np.load(work / "dedup" / f"{i:05d}.npy") if task["dedup"] else None
    moved = task["moved"]
    parts: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    counts = {s: {"documents": 0, "bytes": 0, "tokens": 0} for s in SPLITS}
    tok_lens: list[np.ndarray] = []
    char_lens: list[int] = []
    buffers: dict[str, list[str]] = {s: [] for s in SPLITS}
    sizes = {s: 0 for s in SPLITS}

    def flush(split: str) -> None:
        texts = buffers[split]
        ids, nbytes, lengths = encode_documents(tokenizer, texts, dtype)
        parts[split].append(ids)
        c = counts[split]
        c["documents"] += len(texts)
        c["bytes"] += nbytes
        c["tokens"] += int(ids.size)
        tok_lens.append(lengths)
        buffers[split], sizes[split] = [], 0

    cuts = task.get("cuts") or {}
    for _, d in shard_documents(work, i, mask):
        if d["id"] in cuts:
            pieces = cut_pieces(d["text"], cuts[d["id"]])
        else:
            pieces = [(moved.get(d["id"]) or assign_split(d["id"], task["seed"], task["val_fraction"],
                                                          task["test_fraction"]), d["text"])]
        for split, text in pieces:
            buffers[split].append(text)
            char_lens.append(len(text))
            sizes[split] += len(text)
            if sizes[split] >= BATCH_CHARS or len(buffers[split]) >= BATCH_DOCS:
                flush(split)
    for split in SPLITS:
        if buffers[split]:
            flush(split)
    for split in SPLITS:
        arr = np.concatenate(parts[split]) if parts[split] else np.zeros(0, dtype)
        atomic_save_npy(out / f"{name}.{split}.npy", arr)
    result = {"splits": counts,
              "hist_tokens": histogram(np.concatenate(tok_lens) if tok_lens else np.zeros(0, np.int64)),
              "hist_characters": histogram(np.array(char_lens, dtype=np.int64)), "pid": os.getpid()}
    atomic_write_json(out / f"{name}.json", result)
    return result


#: a curated shard of more than twice this many UTF-8 bytes is tokenized in windows of about
#: this size, one task each, so that one big file keeps every worker busy (`gptforge.data.windows`);
#: 32 MiB: a shard of the default input size (64 MiB of uncompressed text) stays one task.
ENCODE_WINDOW_BYTES = 32 << 20


def encode_window_task(task: dict[str, Any]) -> dict[str, Any]:
    """Tokenize one window of a big curated shard (`task["spans"]`, see `windows.plan_encode_windows`).

    Writes `ENC/NAME.{split}.npy` (ids; EOS only after a span that ends its text) and
    `ENC/NAME.json`: counts per split (a text counts as a document in the window holding its
    last span), histograms of the texts wholly inside the window, and `partials` [[key,
    tokens, characters], ...] for the texts it holds part of (the parent adds them up).
    """
    from gptforge.data.curate import atomic_save_npy
    from gptforge.data.windows import ShardText

    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    out = Path(task["out"])
    tokenizer = Tokenizer.from_file(task["tokenizer"], task.get("eos_token"))
    dtype = np.dtype(task["dtype"])
    text = ShardText(Path(task["work"]), task["shard"])
    parts: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    counts = {s: {"documents": 0, "bytes": 0, "tokens": 0} for s in SPLITS}
    whole_tokens: list[int] = []
    whole_chars: list[int] = []
    partials: list[list] = []
    buffers: dict[str, list[tuple[str, list]]] = {s: [] for s in SPLITS}
    sizes = {s: 0 for s in SPLITS}

    def flush(split: str) -> None:
        batch = buffers[split]
        ends = [span[3] == span[4] for _, span in batch]
        ids, nbytes, lengths = encode_documents(tokenizer, [t for t, _ in batch], dtype, ends)
        parts[split].append(ids)
        c = counts[split]
        c["documents"] += sum(ends)
        c["bytes"] += nbytes
        c["tokens"] += int(ids.size)
        for (t, span), n_tokens in zip(batch, lengths.tolist(), strict=True):
            if span[2] == span[1] and span[3] == span[4]:
                whole_tokens.append(n_tokens)
                whole_chars.append(len(t))
            else:
                partials.append([f"{span[0]}:{span[1]}", n_tokens, len(t)])
        buffers[split], sizes[split] = [], 0

    for span in task["spans"]:
        pos, _, start, end, _, split = span
        piece = bytes(text.text_bytes(pos)[start:end]).decode("utf-8", "surrogatepass")
        buffers[split].append((piece, span))
        sizes[split] += len(piece)
        if sizes[split] >= BATCH_CHARS or len(buffers[split]) >= BATCH_DOCS:
            flush(split)
    for split in SPLITS:
        if buffers[split]:
            flush(split)
    name = task["name"]
    for split in SPLITS:
        arr = np.concatenate(parts[split]) if parts[split] else np.zeros(0, dtype)
        atomic_save_npy(out / f"{name}.{split}.npy", arr)
    result = {"splits": counts, "hist_tokens": histogram(np.array(whole_tokens, np.int64)),
              "hist_characters": histogram(np.array(whole_chars, np.int64)), "partials": partials, "pid": os.getpid()}
    atomic_write_json(out / f"{name}.json", result)
    return result


def merge_windows(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One shard's encode result (as `encode_task` gives) from its windows' results, in order."""
    counts = {s: {k: sum(r["splits"][s][k] for r in results) for k in ("documents", "bytes", "tokens")}
              for s in SPLITS}
    texts: dict[str, list[int]] = {}
    for r in results:
        for key, n_tokens, n_chars in r["partials"]:
            acc = texts.setdefault(key, [0, 0])
            acc[0] += n_tokens
            acc[1] += n_chars
    split_tokens = np.array([v[0] for v in texts.values()], np.int64)
    split_chars = np.array([v[1] for v in texts.values()], np.int64)
    return {"splits": counts,
            "hist_tokens": (np.sum([r["hist_tokens"] for r in results], axis=0)
                            + np.array(histogram(split_tokens))).tolist(),
            "hist_characters": (np.sum([r["hist_characters"] for r in results], axis=0)
                                + np.array(histogram(split_chars))).tolist(),
            "pids": sorted({r["pid"] for r in results})}


# --------------------------------------------------------------------------------------------
# The pipeline
# --------------------------------------------------------------------------------------------


@dataclass
class _Scan:
    documents: dict[str, int] = field(default_factory=lambda: {s: 0 for s in SPLITS})
    lowest_train: list[tuple[float, str]] = field(default_factory=list)  # 2 lowest scores


def _make_progress(show: bool):
    """The phases' progress (gptforge.progress.Phases): bars on a terminal, log lines otherwise."""
    from gptforge.progress import Phases

    return Phases(enabled=show, transient=False, unit="shards")


def _merge_shard_stats(results: list[dict[str, Any]], names: list[str]) -> tuple[ReadStats, NormalizeStats, list[StepStats]]:
    rstats, nstats = ReadStats(), NormalizeStats()
    steps = [StepStats(n) for n in names]
    for r in results:
        rd = r["read"]
        other = ReadStats(files_read=rd["files_read"], documents=rd["documents"], input_bytes=rd["input_bytes"],
                          undecodable_sequences=rd["undecodable_sequences"],
                          documents_with_undecodable=rd["documents_with_undecodable"],
                          files_skipped=dict(rd["files_skipped"]), records_skipped=dict(rd["records_skipped"]),
                          files_truncated=rd["files_truncated"], warnings=list(r.get("warnings", [])))
        rstats.merge(other)
        nd = r["normalize"]
        nstats.merge(NormalizeStats(nd["documents_in"], nd["documents_out"], nd["characters_out"], dict(nd["dropped"])))
        for st, d in zip(steps, r["steps"], strict=True):
            st.merge(step_from_dict(d))
    return rstats, nstats, steps


def step_from_dict(d: dict[str, Any]) -> StepStats:
    """The inverse of `StepStats.to_dict`."""
    from collections import Counter

    st = StepStats(d["name"], d["documents_in"], d["documents_out"], d["characters_in"], d["characters_out"],
                   Counter(d["dropped"]), {k: list(v) for k, v in d["examples"].items()}, Counter(d["counts"]))
    return st


def prepare(cfg: PrepareConfig, show_progress: bool = True) -> PrepareResult:
    """Run the whole prepare pipeline (see module docstring) and write the shard folder.

    Raises:
        FileNotFoundError: an input path, recipe or --tokenizer file does not exist.
        FileExistsError: the output folder exists and is not empty, without `overwrite`.
        EmptyCorpusError: no document left (the message names the step that removed the last).
        BadInputError: bad input under `strict`.
        ValueError: an invalid option or recipe.
    """
    from gptforge.runtime.lock import FolderLock

    t0 = time.perf_counter()
    cfg.validate()
    out_dir = Path(cfg.out)
    with FolderLock(out_dir, command="gptforge prepare"):
        return _prepare_locked(cfg, out_dir, show_progress, t0)


def _remove_leftovers(out_dir: Path) -> None:
    """Temporary output folders (`.OUT.tmp-*`) and old copies (`.OUT.old-*`) of dead runs.

    Only called under the output's lock, so none of them belongs to a live writer.
    """
    for pattern in (f".{out_dir.name}.tmp-*", f".{out_dir.name}.old-*"):
        for p in out_dir.parent.glob(pattern):
            shutil.rmtree(p, ignore_errors=True)


def _remove_partial_files(work: Path) -> None:
    """Half-written temp files (`.NAME.XXXX.tmp*`) in a reused work folder: a dead run's debris."""
    for p in work.rglob(".*.tmp*"):
        if p.is_file():
            p.unlink(missing_ok=True)


def _completed_output(out_dir: Path, fingerprint_sha: str) -> dict[str, Any] | None:
    """meta.json of `out_dir` when it is a complete output of this very run (same fingerprint)."""
    from gptforge.data.shards import load_meta

    if not (out_dir / "meta.json").is_file():
        return None
    try:
        meta = load_meta(out_dir)
    except (OSError, ValueError):
        return None
    if meta.get("prepare_config", {}).get("work_fingerprint_sha256") != fingerprint_sha:
        return None
    return meta


def option_differences(recorded: dict[str, Any], cfg: PrepareConfig) -> list[str]:
    """Options of `cfg` that differ from a finished output's meta.json `prepare_config`, as
    '--vocab-size 8192 (this call: 4096)'; keys the record lacks (an older gptforge's) are skipped."""
    now = json.loads(json.dumps(cfg.meta_dict()))  # tuples as lists, as meta.json holds them
    return [f"--{k.replace('_', '-')} {json.dumps(recorded[k])} (this call: {json.dumps(v)})"
            for k, v in now.items() if k in recorded and recorded[k] != v]


def check_rerun_output(out_dir: Path, cfg: PrepareConfig) -> None:
    """Refuse a non-empty `out_dir` (without `overwrite`), saying, when it holds a complete
    prepare output, which recorded options differ from this call, or that they are the same
    (then the inputs or the recipe's content changed since).

    Raises:
        FileExistsError: `out_dir` exists, is not empty and `cfg.overwrite` is False.
    """
    from gptforge.data.shards import load_meta

    if cfg.overwrite or not (out_dir / "meta.json").is_file():
        return check_output_dir(out_dir, cfg.overwrite)
    try:
        recorded = load_meta(out_dir).get("prepare_config") or {}
    except (OSError, ValueError):
        return check_output_dir(out_dir, cfg.overwrite)
    diff = option_differences(recorded, cfg)
    what = (f"made with other options: {'; '.join(diff)}" if diff else
            "made with the same options as this call, but its inputs (files, sizes or dates) or its recipe's "
            "content differ")
    raise FileExistsError(f"output folder {out_dir} holds a complete prepare output {what}; "
                          f"choose another --out or pass --overwrite to replace it")


def _prepare_locked(cfg: PrepareConfig, out_dir: Path, show_progress: bool, t0: float) -> PrepareResult:
    """`prepare` once the output folder's lock is held: cleans up after itself on every exit."""
    files = expand_inputs(cfg.inputs)
    recipe_dict = with_languages(load_recipe(cfg.recipe), cfg.languages, cfg.language_score)
    recipe = build_recipe(recipe_dict)
    tokenizer = Tokenizer.from_file(cfg.tokenizer) if cfg.tokenizer else None
    workers = cfg.workers or default_workers()

    # With --limit the first N documents in reading order are wanted: one shard reads them.
    shard_bytes = cfg.shard_bytes or auto_shard_bytes(files)
    shards = ([[str(f) for f in files]] if cfg.limit else
              plan_shards(files, shard_bytes, cfg.doc_separator, cfg.encoding))
    work = work_dir_for(out_dir)
    options = {"recipe": recipe_dict, "text_field": cfg.text_field, "doc_separator": cfg.doc_separator,
               "limit": cfg.limit, "strict": cfg.strict, "shard_bytes": shard_bytes}
    fingerprint = work_fingerprint(cfg, files, options)
    fingerprint_sha = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()
    _remove_leftovers(out_dir)
    done_meta = None if cfg.overwrite else _completed_output(out_dir, fingerprint_sha)
    if done_meta is not None:
        # A kill after the output's rename but before the work folder's removal, or a plain rerun.
        shutil.rmtree(work, ignore_errors=True)
        log.info(f"{out_dir} is already complete for these inputs and options: nothing to do")
        return PrepareResult(out_dir, done_meta, ReadStats(), NormalizeStats(), time.perf_counter() - t0,
                             already_done=True)
    check_rerun_output(out_dir, cfg)
    reused = open_work_dir(work, fingerprint)
    try:
        return _run_pipeline(cfg, out_dir, files, recipe_dict, recipe, tokenizer, workers, shards, work,
                             reused, fingerprint_sha, show_progress, t0)
    except Exception:
        # A failed run's work folder cannot be resumed into success and may fill a disk; an
        # interrupted one (Ctrl-C, SIGTERM as KeyboardInterrupt/SystemExit) is kept for the rerun.
        if not cfg.keep_work:
            shutil.rmtree(work, ignore_errors=True)
        raise


def _run_pipeline(cfg: PrepareConfig, out_dir: Path, files: list[Path], recipe_dict: dict[str, Any], recipe: Any,
                  tokenizer: Tokenizer | None, workers: int, shards: list[list[Any]], work: Path, reused: bool,
                  fingerprint_sha: str, show_progress: bool, t0: float) -> PrepareResult:
    from gptforge.data.report import build_report, recount_output, write_report

    if reused:
        log.info(f"resuming from {work}")
        _remove_partial_files(work)
    for sub in ("lines", "curate", "dedup"):
        (work / sub).mkdir(exist_ok=True)
    base = {"work": str(work), "recipe": recipe_dict, "text_field": cfg.text_field,
            "doc_separator": cfg.doc_separator, "limit": cfg.limit, "strict": cfg.strict, "encoding": cfg.encoding}
    tasks = [{**base, "index": i, "files": shard} for i, shard in enumerate(shards)]
    timings: dict[str, float] = {}
    boilerplate_info: dict[str, Any] = {}

    progress = _make_progress(show_progress)
    with progress, WorkerPool(workers, lock_folder=out_dir) as pool:
        # ---- curation ----
        if recipe.boilerplate is not None:
            t = time.perf_counter()
            run_tasks(lines_task, tasks, lambda i: (work / "lines" / f"{i:05d}.json").exists(), pool,
                      progress, "count lines")
            from gptforge.data.boilerplate import merge_frequent
            from gptforge.data.curate import atomic_save_npy

            n_docs = sum(json.loads((work / "lines" / f"{i:05d}.json").read_text())["documents"] for i in range(len(shards)))
            threshold = recipe.boilerplate.threshold(n_docs)
            if not (work / "boilerplate.npy").exists():
                keys = merge_frequent([(work / "lines" / f"{i:05d}.keys.npy", work / "lines" / f"{i:05d}.counts.npy")
                                       for i in range(len(shards))], threshold)
                atomic_save_npy(work / "boilerplate.npy", keys)
            boilerplate_info = {"documents_counted": n_docs, "threshold_documents": threshold,
                                "boilerplate_lines": int(np.load(work / "boilerplate.npy").size)}
            timings["count_lines"] = time.perf_counter() - t
        t = time.perf_counter()
        run_tasks(curate_task, tasks, lambda i: (work / "curate" / f"{i:05d}.json").exists(), pool,
                  progress, "curate")
        timings["curate"] = time.perf_counter() - t
        results = [json.loads((work / "curate" / f"{i:05d}.json").read_text(encoding="utf-8")) for i in range(len(shards))]
        chain_names = [s.name for s in recipe.before] + (["boilerplate"] if recipe.boilerplate else []) + [s.name for s in recipe.after]
        rstats, nstats, steps = _merge_shard_stats(results, chain_names)
        for w in rstats.warnings[:20]:
            log.warning(w)
        if len(rstats.warnings) > 20:
            log.warning(f"... {sum(rstats.files_skipped.values()) + sum(rstats.records_skipped.values())} "
                        f"skipped files/records in all (see report.json)")
        dedup_info: dict[str, Any] = {}
        if recipe.dedup is not None:
            t = time.perf_counter()
            done = work / "dedup" / "done.json"
            dedup_info = json.loads(done.read_text()) if done.exists() else global_dedup(work, len(shards), recipe)
            steps.append(step_from_dict(dedup_info["step"]))
            timings["dedup"] = time.perf_counter() - t
        warn_heavy_steps(steps)
        masks = ([np.load(work / "dedup" / f"{i:05d}.npy") for i in range(len(shards))]
                 if recipe.dedup is not None else [None] * len(shards))

        # ---- split ----
        scan = _Scan()
        for i in range(len(shards)):
            for _, d in shard_documents(work, i, masks[i], ("id",)):
                split = assign_split(d["id"], cfg.seed, cfg.val_fraction, cfg.test_fraction)
                scan.documents[split] += 1
                if split == "train":
                    score = split_score(d["id"], cfg.seed)
                    if len(scan.lowest_train) < 2 or (score, d["id"]) < scan.lowest_train[-1]:
                        scan.lowest_train = sorted(scan.lowest_train + [(score, d["id"])])[:2]
        total_docs = sum(scan.documents.values())
        if total_docs == 0:
            raise EmptyCorpusError(_empty_message(files, rstats, nstats, steps))
        moved: dict[str, str] = {}
        if scan.documents["train"] == 0:
            # Every document hashed into val/test (one input.txt does so with probability
            # val_fraction + test_fraction): start them all in train, then split as below.
            ids = sorted((split_score(d["id"], cfg.seed), d["id"]) for i in range(len(shards))
                         for _, d in shard_documents(work, i, masks[i], ("id",)))
            moved = {doc_id: "train" for _, doc_id in ids}
            scan.documents = {"train": total_docs, "val": 0, "test": 0}
            scan.lowest_train = ids[:2]
        small = _small_corpus_rule(cfg, scan)
        moved.update(small)
        for split in small.values():
            scan.documents["train"] -= 1
            scan.documents[split] += 1
        if scan.documents["train"] == 0:
            raise EmptyCorpusError(f"no document left for the train split ({total_docs} documents, all in "
                                   f"val/test); lower --val-fraction/--test-fraction or add documents")
        cuts = _position_split(cfg, scan, work, len(shards), masks, moved, rstats)
        pieces_added = sum(len(c) - 1 for c in cuts.values())

        # ---- tokenizer ----
        t = time.perf_counter()
        tok_path = work / "tokenizer.json"
        if tokenizer is None:
            if tok_path.exists():
                tokenizer = Tokenizer.from_file(tok_path)
            else:
                # Sized for the characters the tokenizer is trained on: after curation and dedup,
                # train split only, up to --tokenizer-train-bytes (one counting pass).
                train_chars = sum(len(p) for p in _train_texts(work, len(shards), masks, cfg, moved, cuts))
                vocab = check_vocab_size(cfg.vocab_size, train_chars)
                tokenizer = train_bpe(_train_texts(work, len(shards), masks, cfg, moved, cuts), vocab,
                                      min_frequency=cfg.min_frequency)
                tokenizer.save(tok_path)
            timings["train_tokenizer"] = time.perf_counter() - t
        else:
            tok_path = work / "given_tokenizer.json"
            tokenizer.save(tok_path)
        dtype = dtype_for_vocab(tokenizer.vocab_size)

        # ---- encode ----
        t = time.perf_counter()
        key = hashlib.sha256(json.dumps([tokenizer.sha256, cfg.seed, cfg.val_fraction, cfg.test_fraction,
                                         sorted(moved.items()), sorted(cuts.items()), ENCODE_WINDOW_BYTES]).encode()).hexdigest()[:12]
        enc = work / f"encode-{key}"
        enc.mkdir(exist_ok=True)
        common = {"work": str(work), "out": str(enc), "tokenizer": str(tok_path), "eos_token": tokenizer.eos_token,
                  "dtype": dtype.name}
        etasks, names = _encode_tasks(cfg, common, work, len(shards), masks, moved, cuts, recipe.dedup is not None)
        _run_encode(etasks, enc, pool, progress)
        timings["tokenize"] = time.perf_counter() - t
        encoded = []
        for shard_names in names:
            parts = [json.loads((enc / f"{n}.json").read_text()) for n in shard_names]
            encoded.append(parts[0] if len(parts) == 1 and "partials" not in parts[0] else merge_windows(parts))

        # ---- write ----
        t = time.perf_counter()
        with ShardWriter(out_dir, tokenizer, max_shard_bytes=cfg.max_shard_bytes, overwrite=cfg.overwrite) as writer:
            for shard_names in names:
                for n in shard_names:
                    e = json.loads((enc / f"{n}.json").read_text())
                    for split in SPLITS:
                        c = e["splits"][split]
                        if c["tokens"]:
                            writer.write(split, np.load(enc / f"{n}.{split}.npy"), c["documents"], c["bytes"])
            written = sum(writer.splits[s]["documents"] for s in SPLITS)
            if written != total_docs + pieces_added:
                raise RuntimeError(f"the work folder changed while prepare ran: {total_docs} documents curated, "
                                   f"{written} encoded; delete {work} and run prepare again")
            prepare_config = {**cfg.meta_dict(), "recipe_steps": recipe_dict, "tokenizer_trained": cfg.tokenizer is None,
                              "moved_to_val_or_test": sorted(k for k, v in moved.items() if v != "train"),
                              "work_fingerprint_sha256": fingerprint_sha,
                              "position_split": {k: v for k, v in sorted(cuts.items())}}
            report_holder: dict[str, Any] = {}

            def add_report(tmp_dir: Path, meta: dict[str, Any]) -> None:
                timings["write"] = time.perf_counter() - t
                recount = recount_output(tmp_dir, meta)
                report = build_report(cfg=cfg, recipe=recipe_dict, files=files, shards=len(shards), read=rstats,
                                      normalize=nstats, steps=steps, dedup=dedup_info, boilerplate=boilerplate_info,
                                      encoded=encoded, meta=meta, recount=recount, timings=timings,
                                      seconds=time.perf_counter() - t0, hist_edges=HIST_EDGES, resumed=reused,
                                      pieces_added=pieces_added)
                # CPU seconds the shards took in their processes (wall time on a shared machine
                # says little): input MB per CPU second is the throughput per core.
                for phase, folder in (("count_lines", "lines"), ("curate", "curate")):
                    if phase in report["throughput"]:
                        cpu = sum(json.loads((work / folder / f"{i:05d}.json").read_text()).get("cpu_seconds", 0.0)
                                  for i in range(len(shards)))
                        report["throughput"][phase]["shard_cpu_seconds"] = round(cpu, 3)
                report["inputs"]["byte_range_shards"] = sum(isinstance(src, dict) for sh in shards for src in sh)
                report["throughput"]["curate"]["processes"] = len({r.get("pid") for r in results} - {None})
                # How the tokenize phase was cut up: one task per shard, a big shard one per window.
                tok = report["throughput"].setdefault("tokenize", {})
                tok["tasks"] = len(etasks)
                tok["windowed_shards"] = sum(len(n) > 1 or ".w" in n[0] for n in names)
                tok["processes"] = len({p for e in encoded for p in e.get("pids", [e.get("pid")]) if p is not None})
                write_report(tmp_dir, report)
                report_holder["report"] = report

            meta = writer.finish(prepare_config=prepare_config, before_move=add_report)
    if not cfg.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    return PrepareResult(out_dir, meta, rstats, nstats, time.perf_counter() - t0, moved, steps,
                         report_holder.get("report", {}))


def _encode_tasks(cfg: PrepareConfig, common: dict[str, Any], work: Path, n_shards: int, masks: list,
                  moved: dict[str, str], cuts: dict[str, list], dedup: bool) -> tuple[list[dict[str, Any]], list[list[str]]]:
    """The tokenize phase's tasks, and per shard the names of its result files in order.

    A shard is one `encode_task` (files `NNNNN.*`), or, when its kept text is over twice
    `ENCODE_WINDOW_BYTES`, one `encode_window_task` per window (`NNNNN.wKKKKofMMMM.*`).
    """
    from gptforge.data.windows import ShardText, plan_encode_windows

    def split_of(doc_id: str) -> str:
        return moved.get(doc_id) or assign_split(doc_id, cfg.seed, cfg.val_fraction, cfg.test_fraction)

    tasks: list[dict[str, Any]] = []
    names: list[list[str]] = []
    for i in range(n_shards):
        windows = plan_encode_windows(ShardText(work, i), masks[i], split_of, cuts, ENCODE_WINDOW_BYTES)
        if windows is None:
            names.append([f"{i:05d}"])
            tasks.append({**common, "fn": "shard", "index": len(tasks), "shard": i, "name": f"{i:05d}",
                          "dedup": dedup, "moved": moved, "seed": cfg.seed, "val_fraction": cfg.val_fraction,
                          "test_fraction": cfg.test_fraction, "cuts": cuts})
            continue
        names.append([f"{i:05d}.w{k:04d}of{len(windows):04d}" for k in range(len(windows))])
        for name, spans in zip(names[-1], windows, strict=True):
            tasks.append({**common, "fn": "window", "index": len(tasks), "shard": i, "name": name, "spans": spans})
    return tasks, names


def _encode_any(task: dict[str, Any]) -> dict[str, Any]:
    """`encode_task` or `encode_window_task`, as the task says (one pool phase runs both)."""
    return encode_window_task(task) if task["fn"] == "window" else encode_task(task)


def _run_encode(tasks: list[dict[str, Any]], enc: Path, pool: WorkerPool, progress: Any) -> None:
    run_tasks(_encode_any, tasks, lambda k: (enc / f"{tasks[k]['name']}.json").exists(), pool, progress, "tokenize")


def with_languages(recipe: dict[str, Any], languages: list[str] | None, score: float | None) -> dict[str, Any]:
    """`recipe` with its langid step keeping `languages` (added after `clean`, or first, when absent)."""
    if not languages and score is None:
        return recipe
    steps = list(recipe.get("steps") or [])
    opts: dict[str, Any] = {}
    if languages:
        opts["languages"] = list(languages)
    if score is not None:
        opts["min_score"] = score
    for i, entry in enumerate(steps):
        if isinstance(entry, dict) and "langid" in entry:
            steps[i] = {"langid": {**(entry["langid"] or {}), **opts}}
            break
    else:
        at = next((i + 1 for i, e in enumerate(steps) if isinstance(e, dict) and "clean" in e), 0)
        steps.insert(at, {"langid": opts})
    return {**recipe, "steps": steps}


def _train_texts(work: Path, n_shards: int, masks: list, cfg: PrepareConfig, moved: dict[str, str],
                 cuts: dict[str, list] | None = None) -> Iterator[str]:
    """Train-split texts in shard order, up to `tokenizer_train_bytes` characters."""
    used = 0
    cuts = cuts or {}
    for i in range(n_shards):
        for _, d in shard_documents(work, i, masks[i]):
            if d["id"] in cuts:
                texts = [t for split, t in cut_pieces(d["text"], cuts[d["id"]]) if split == "train"]
            elif (moved.get(d["id"]) or assign_split(d["id"], cfg.seed, cfg.val_fraction, cfg.test_fraction)) == "train":
                texts = [d["text"]]
            else:
                continue
            for text in texts:
                # Long texts in whitespace-cut pieces: the BPE trainer's pre-tokenization of one
                # huge string took ~80 bytes per character; the word counts are the same.
                for piece in whitespace_pieces(text, TOKENIZE_PIECE_CHARS):
                    if cfg.tokenizer_train_bytes and used >= cfg.tokenizer_train_bytes:
                        return
                    used += len(piece)
                    yield piece


#: a split cut from inside a document holds at least this many characters (~4k tokens: a few
#: context windows of a small model), or a quarter of the document when that is less.
MIN_POSITION_SPLIT_CHARS = 16_384


def cut_pieces(text: str, cut: list[list]) -> list[tuple[str, str]]:
    """(split, piece) of `text` for a cut [[0, "train"], [c1, "val"], ...] (start characters)."""
    bounds = [int(b) for b, _ in cut] + [len(text)]
    return [(split, text[bounds[k]:bounds[k + 1]]) for k, (_, split) in enumerate(cut)]


def _snap(text: str, pos: int) -> int:
    """`pos` moved forward to just after the next line break (or space) within 1/20 of the text."""
    limit = min(len(text), pos + max(64, len(text) // 20))
    for sep in ("\n", " "):
        k = text.find(sep, pos, limit)
        if k >= 0:
            return k + 1
    return pos


def _position_split(cfg: PrepareConfig, scan: _Scan, work: Path, n_shards: int, masks: list,
                    moved: dict[str, str], rstats: ReadStats | None = None) -> dict[str, list]:
    """Val/test cut from the end of the largest train document, when the document split leaves them empty.

    nanoGPT's layout (one input.txt) is one document, so a split by document gives val nothing:
    then the last `val_fraction` (and before it `test_fraction`) of that document's characters,
    at least `MIN_POSITION_SPLIT_CHARS` each (at most a quarter of the document), become the
    val (test) split, cut just after a line break. With enough documents nothing is cut.
    Updates `scan.documents`. Returns {doc id: [[0, "train"], [start, split], ...]}.
    `rstats` (what reading found) lets the warning say when --doc-separator occurred in no file.
    """
    missing = [s for s, f in (("test", cfg.test_fraction), ("val", cfg.val_fraction)) if f > 0 and not scan.documents[s]]
    if not missing:
        return {}
    best: tuple[int, str] | None = None
    for i in range(n_shards):
        for _, d in shard_documents(work, i, masks[i]):
            split = moved.get(d["id"]) or assign_split(d["id"], cfg.seed, cfg.val_fraction, cfg.test_fraction)
            if split == "train" and (best is None or len(d["text"]) > best[0]):
                best = (len(d["text"]), d["id"])
    if best is None:
        return {}
    for i in range(n_shards):
        for _, d in shard_documents(work, i, masks[i]):
            if d["id"] == best[1]:
                text = d["text"]
    n = len(text)
    fractions = {"val": cfg.val_fraction, "test": cfg.test_fraction}
    cut: list[list] = []
    end = n
    for split in missing:  # test last in the text, val before it (nanoGPT: val is the end)
        size = min(max(int(fractions[split] * n), MIN_POSITION_SPLIT_CHARS), n // 4)
        start = _snap(text, end - size) if size else end
        if not 0 < start < end:
            continue
        cut.insert(0, [start, split])
        end = start
    if not cut:
        return {}
    for _, split in cut:
        scan.documents[split] += 1
    ends = [c[0] for c in cut[1:]] + [n]
    shares = ", ".join(f"{split}: the {b - start:,} characters from {start:,}" for (start, split), b in zip(cut, ends, strict=True))
    not_found = (cfg.doc_separator is not None and rstats is not None
                 and rstats.documents <= rstats.files_read)  # no file gave more than one document
    # A separated file's ids are PATH@N (gptforge.data.readers.text): name the file itself.
    where = f"the one document of {best[1].rsplit('@', 1)[0]}" if not_found else best[1]
    advice = (f"--doc-separator {cfg.doc_separator!r} was not found in the input (each file was read as one "
              "document): check the separator, or give more documents, for a split by document" if not_found
              else "give more documents, or cut a file into documents with --doc-separator, for a split by document")
    log.warning(f"the corpus has too few documents for a {'/'.join(missing)} split by document "
                f"({sum(scan.documents.values()) - len(cut)} after curation): split by position inside "
                f"{where} instead, as nanoGPT does ({shares}, of {n:,}); {advice}")
    return {best[1]: [[0, "train"]] + cut}


AUTO_VOCAB_MIN, AUTO_VOCAB_MAX = 512, 32768


def auto_vocab_size(n_chars: int) -> int:
    """Vocabulary size for a corpus of `n_chars` characters (after normalization) when
    --vocab-size is not given: 4 * sqrt(n_chars) rounded to the nearest power of two, clamped to
    [512, 32768]. 100 kB -> 1024, 1 MB -> 4096, 16 MB -> 16384, 64 MB and more -> 32768.

    A heuristic (gptforge's, not from a paper): the vocabulary grows sublinearly with the data,
    as the compute-optimal vocabularies of Tao et al. 2024 ("Scaling Laws with Vocabulary") do, so
    that each merge is still seen often (a 4096-token vocabulary over 1 MB of text leaves ~70
    occurrences per token type) rather than 32000 types over a few MB.
    """
    import math

    target = 4.0 * math.sqrt(max(1, n_chars))
    return int(min(AUTO_VOCAB_MAX, max(AUTO_VOCAB_MIN, 2 ** round(math.log2(target)))))


def check_vocab_size(vocab_size: int, n_chars: int) -> int:
    """The vocabulary size to train: `vocab_size`, or `auto_vocab_size(n_chars)` when it is 0
    (logged). Logs a warning when an explicit size is more than 4x above or below the rule."""
    auto = auto_vocab_size(n_chars)
    if vocab_size == 0:
        log.info(f"vocabulary size {auto} chosen for {n_chars:,} characters of tokenizer training text "
                 "(set --vocab-size to override)")
        return auto
    if vocab_size > 4 * auto or 4 * vocab_size < auto:
        log.warning(f"--vocab-size {vocab_size} is far from the {auto} that fits {n_chars:,} characters of text "
                    f"(gptforge.data.prepare.auto_vocab_size); "
                    + ("many token types will be rare or unused" if vocab_size > auto else
                       "sequences will be long in tokens"))
    return vocab_size


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


def _empty_message(files: list[Path], rstats: ReadStats, nstats: NormalizeStats, steps: list[StepStats]) -> str:
    parts = [f"no documents to prepare: {len(files)} file(s) found, {rstats.files_read} read"]
    if not files:
        from gptforge.data.readers import SUPPORTED_EXTS

        parts.append(f"folders are searched for {', '.join(sorted(SUPPORTED_EXTS))} files (optionally compressed); "
                     "name other files explicitly, or use a glob such as 'src/**/*.py'")
    if rstats.documents and nstats.documents_out:
        for st in steps:
            if st.documents_in and not st.documents_out:
                reasons = ", ".join(f"{v} {k}" for k, v in st.dropped.most_common())
                parts.insert(0, f"the recipe step {st.name!r} removed every remaining document "
                                f"({st.documents_in} in: {reasons}); relax its options in the recipe or choose "
                                f"another --recipe")
                break
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
    if result.already_done:
        rows = [("status", "already complete for these inputs and options; nothing ran (report.html has the counts)")]
        rows += _output_rows(meta)
        rows.append(("time", f"{result.seconds:.1f} s"))
        return rows
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
    for st in result.steps:
        for reason, count in st.dropped.most_common():
            if count:
                rows.append((f"{st.name}: {reason}", f"{count:,}"))
        for what, count in sorted(st.counts.items()):
            rows.append((f"{st.name}: {what}", f"{count:,}"))
    if r.undecodable_sequences:
        rows.append(("undecodable byte sequences replaced", f"{r.undecodable_sequences:,} in {r.documents_with_undecodable:,} documents"))
    # What was written, after every curation step (normalization's own count is before them).
    kept = sum(meta["splits"][sp]["documents"] for sp in SPLITS)
    written_chars = result.steps[-1].characters_out if result.steps else n.characters_out
    # A split by position cuts a document into train/val/test pieces: the pieces are counted apart,
    # so that "kept" never exceeds "read".
    cut = meta.get("prepare_config", {}).get("position_split") or {}
    pieces = sum(len(c) - 1 for c in cut.values())  # pieces added on top of the documents cut
    rows.append(("documents kept", f"{kept - pieces:,}"))
    if pieces:
        rows.append(("pieces written", f"{kept:,} ({len(cut)} document(s) cut by position into "
                                       f"{pieces + len(cut)} train/val/test pieces)"))
    rows.append(("characters kept", f"{written_chars:,}"))
    rows += _output_rows(meta)
    cfg = meta.get("prepare_config", {})
    if cfg.get("val_fraction", 0) > 0 and not meta["splits"]["val"]["documents"]:
        rows.append(("WARNING", "no val split: too few documents (a single big file is one document; split it "
                                "with --doc-separator, or give more files); pretrain will run without validation"))
    rows.append(("time", f"{result.seconds:.1f} s"))
    return rows


def _output_rows(meta: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [("tokenizer", f"vocab {meta['vocab_size']:,}, eos id {meta['eos_id']}, {meta['dtype']}, "
                          f"sha256 {meta['tokenizer_sha256'][:12]}")]
    for split in SPLITS:
        s = meta["splits"][split]
        if not s["documents"]:
            continue
        text_tokens = s["tokens"] - s["documents"]
        bpt = s["bytes"] / text_tokens if text_tokens else float("nan")
        rows.append((f"{split}", f"{s['documents']:,} docs, {s['tokens']:,} tokens, {s['bytes']:,} bytes, "
                     f"{bpt:.2f} bytes/token, {len(s['files'])} file(s)"))
    return rows
