"""Phase 3, tokenizer: the given tokenizer, or a byte-level BPE trained on the train split's text.

The sample is the train split's text after curation and dedup, in shard order, up to
`tokenizer_train_bytes` UTF-8 bytes (whole pieces: the last may pass the cap), cut in whitespace
pieces (`sample_texts`). The executor's
tasks build it per shard (`sample_task`: `tokenizer_sample/NNNNN.arrow`, at most the cap from each
shard), in waves in shard order that stop once the shards so far hold the cap; this process
reads the pieces back in shard order, stops at the cap, and trains on them, so the sample, and
the tokenizer, are the same whatever ran the tasks. Its vocabulary size, when not given, follows
its UTF-8 bytes and the characters covering 99.9% of its non-ASCII occurrences
(`gptforge.data.tokenizer.vocab_size_rule`, for any script). The trained tokenizer is kept in the
work folder, so a resumed run does not train it again.

Inputs: the work folder's curated shards and drop masks, `Splits`, the options. Output: the
tokenizer and the path of its file in the work folder (for the encode workers).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from gptforge.data.phases import encode
from gptforge.data.phases.pool import Executor, run_tasks
from gptforge.data.phases.split import SplitRule, Splits, cut_pieces
from gptforge.data.phases.work import WorkFolder
from gptforge.data.text_stats import whitespace_pieces
from gptforge.data.tokenizer import Tokenizer, train_bpe, vocab_size_rule

log = logging.getLogger("gptforge.data")

#: the work folder's phase of the sample's pieces.
SAMPLE_PHASE = "tokenizer_sample"
#: pieces per Arrow record batch of a sample file.
SAMPLE_BATCH = 4096


def shard_train_pieces(work: WorkFolder, index: int, mask: np.ndarray | None, splits: Splits,
                       max_bytes: int) -> Iterator[str]:
    """The train-split pieces of curated shard `index` in order, while fewer than `max_bytes`
    UTF-8 bytes came before (0: all)."""
    used = 0
    cuts = splits.cuts
    for _, d in work.documents(index, mask):
        if d["key"] in cuts:
            texts = [t for split, t in cut_pieces(d["text"], cuts[d["key"]]) if split == "train"]
        elif splits.split_of(d["key"]) == "train":
            texts = [d["text"]]
        else:
            continue
        for text in texts:
            # Long texts in whitespace-cut pieces: the BPE trainer's pre-tokenization of one
            # huge string took ~80 bytes per character; the word counts are the same.
            for piece in whitespace_pieces(text, encode.TOKENIZE_PIECE_CHARS):
                if max_bytes and used >= max_bytes:
                    return
                used += utf8_len(piece)
                yield piece


def sample_task(task: dict[str, Any]) -> dict[str, Any]:
    """One shard's part of the sample -> `tokenizer_sample/NNNNN.arrow` (column `piece`) and `.json`."""
    import pyarrow as pa

    work, i = WorkFolder(task["work"]), task["index"]
    mask = work.drop_mask(task["mask_step"], i) if task["mask_step"] else None
    splits = Splits(SplitRule(task["seed"], task["val_fraction"], task["test_fraction"]), task["moved"],
                    task["cuts"], {}, 0)
    schema = pa.schema([("piece", pa.large_string())])
    chars = n_bytes = pieces = 0
    batch: list[str] = []
    with work.arrow_writer(work.shard_file(SAMPLE_PHASE, i, ".arrow")) as tmp:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            for piece in shard_train_pieces(work, i, mask, splits, task["max_bytes"]):
                batch.append(piece)
                chars += len(piece)
                n_bytes += utf8_len(piece)
                pieces += 1
                if len(batch) >= SAMPLE_BATCH:
                    writer.write_batch(pa.record_batch([pa.array(batch, pa.large_string())], schema=schema))
                    batch = []
            if batch:
                writer.write_batch(pa.record_batch([pa.array(batch, pa.large_string())], schema=schema))
    result = {"characters": chars, "bytes": n_bytes, "pieces": pieces}
    work.write_json(work.shard_file(SAMPLE_PHASE, i, ".json"), result)
    return result


def run_sample(work: WorkFolder, masks: list, splits: Splits, mask_step: str | None, max_bytes: int,
               pool: Executor, progress: Any = None) -> int:
    """Build the sample's shard files (`sample_task`) in waves of 2 x `pool.workers` shards, in
    shard order, until the shards so far hold `max_bytes` UTF-8 bytes; returns how many shards
    the sample reads."""
    rule = splits.rule
    common = {"work": str(work.root), "mask_step": mask_step, "seed": rule.seed, "val_fraction": rule.val_fraction,
              "test_fraction": rule.test_fraction, "moved": splits.moved, "cuts": splits.cuts, "max_bytes": max_bytes}
    tasks: list[dict[str, Any]] = [{**common, "index": i} for i in range(len(masks))]
    wave = max(1, 2 * pool.workers)
    got = used = 0
    while used < len(tasks) and not (max_bytes and got >= max_bytes):
        part = tasks[used:used + wave]
        run_tasks(sample_task, part, lambda i: work.shard_done(SAMPLE_PHASE, i), pool, None, "tokenizer sample")
        for t in part:
            used += 1
            stats = work.shard_stats(SAMPLE_PHASE, t["index"])
            got += stats.get("bytes", stats["characters"])  # a work folder of an older gptforge: characters
            if max_bytes and got >= max_bytes:
                break
    return used


def train_texts(work: WorkFolder, masks: list, splits: Splits, max_bytes: int) -> Iterator[str]:
    """Train-split pieces of every curated shard in shard order, up to `max_bytes` UTF-8 bytes (0:
    all), read in this process: the same pieces as `sample_texts` (used for several sources)."""
    used = 0
    for i, mask in enumerate(masks):
        for piece in shard_train_pieces(work, i, mask, splits, max_bytes):
            if max_bytes and used >= max_bytes:
                return
            used += utf8_len(piece)
            yield piece


def sample_texts(work: WorkFolder, shards: int, max_bytes: int) -> Iterator[str]:
    """The sample: the pieces of the first `shards` sample files in order, up to `max_bytes` UTF-8 bytes (0: all)."""
    import pyarrow as pa

    used = 0
    for i in range(shards):
        with pa.memory_map(str(work.shard_file(SAMPLE_PHASE, i, ".arrow"))) as source:
            reader = pa.ipc.open_file(source)
            for b in range(reader.num_record_batches):
                for piece in reader.get_batch(b).column(0).to_pylist():
                    if max_bytes and used >= max_bytes:
                        return
                    used += utf8_len(piece)
                    yield piece


def utf8_len(text: str) -> int:
    """UTF-8 bytes of `text` (its length when ASCII, without encoding it)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def sample_size(texts: Iterable[str]) -> tuple[int, Counter[str]]:
    """(UTF-8 bytes, character -> occurrences) of `texts`: what `check_vocab_size` sizes by."""
    n_bytes, counts = 0, Counter[str]()
    for piece in texts:
        n_bytes += utf8_len(piece)
        counts.update(piece)
    return n_bytes, counts


def check_vocab_size(vocab_size: int, n_bytes: int, char_counts: Mapping[str, int] | None = None) -> int:
    """The vocabulary size to train: `vocab_size`, or `tokenizer.vocab_size_rule(n_bytes,
    char_counts)` when it is 0 (logged). Logs a warning when an explicit size is more than 4x
    above or below the rule. `n_bytes`: UTF-8 bytes of the training text; `char_counts`: its
    character -> occurrences."""
    auto = vocab_size_rule(n_bytes, char_counts)
    if vocab_size == 0:
        chars = f" ({sum(char_counts.values()):,} characters)" if char_counts else ""
        log.info(f"vocabulary size {auto} chosen for {n_bytes:,} bytes{chars} of tokenizer training text "
                 "(set --vocab-size to override)")
        return auto
    if vocab_size > 4 * auto or 4 * vocab_size < auto:
        log.warning(f"--vocab-size {vocab_size} is far from the {auto} that fits {n_bytes:,} bytes of text "
                    f"(gptforge.data.tokenizer.vocab_size_rule); "
                    + ("many token types will be rare or unused" if vocab_size > auto else
                       "sequences will be long in tokens"))
    return vocab_size


def run_tokenizer(given: Tokenizer | None, work: WorkFolder, masks: list, splits: Splits, mask_step: str | None,
                  vocab_size: int, min_frequency: int, max_bytes: int, pool: Executor,
                  timings: dict[str, float]) -> tuple[Tokenizer, Path]:
    """Phase 3 (see the module docstring): (tokenizer, its file in the work folder)."""
    if given is not None:
        path = work.tokenizer_path(given=True)
        given.save(path)
        return given, path
    t = time.perf_counter()
    path = work.tokenizer_path(given=False)
    if path.exists():
        tokenizer = Tokenizer.from_file(path)
    else:
        shards = run_sample(work, masks, splits, mask_step, max_bytes, pool)
        # Sized for the bytes and characters the tokenizer is trained on (one counting pass).
        vocab = check_vocab_size(vocab_size, *sample_size(sample_texts(work, shards, max_bytes)))
        tokenizer = train_bpe(sample_texts(work, shards, max_bytes), vocab, min_frequency=min_frequency)
        tokenizer.save(path)
    timings["train_tokenizer"] = time.perf_counter() - t
    return tokenizer, path
