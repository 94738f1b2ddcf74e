"""Phase 4, encode: each curated shard's kept documents -> token ids per split, in the workers.

A shard is one `encode_task`; a shard of more than 2 * `ENCODE_WINDOW_BYTES` of text (one big
file) is cut into byte windows, one `encode_window_task` each (`gptforge.data.windows`: the
same tokens). Results go to `encode-KEY/` of the work folder, KEY a hash of the tokenizer and the
splits, so that a rerun with another tokenizer or split never reuses them.

Inputs: the work folder's curated shards and drop masks, `Splits`, the tokenizer. Output:
`Encoded` (the folder, each shard's result names in order, their merged counts).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gptforge.data.phases.pool import Executor, run_tasks
from gptforge.data.phases.split import SplitRule, Splits, cut_pieces
from gptforge.data.phases.work import WorkFolder
from gptforge.data.rank_bpe import encode_texts
from gptforge.data.shards import SPLITS, dtype_for_vocab
from gptforge.data.text_stats import whitespace_pieces
from gptforge.data.tokenizer import Tokenizer

#: characters of text per tokenizer call inside an encode worker.
BATCH_CHARS = 1 << 20
BATCH_DOCS = 2048
#: histogram bin edges (characters, tokens): powers of two, fixed so that shards add up.
HIST_EDGES = [0] + [2 ** k for k in range(0, 31)]

#: a text longer than this is tokenized in pieces cut at whitespace (`text_stats.whitespace_pieces`),
#: which gives the same tokens: the tokenizer library keeps ~100 bytes per token of a call's
#: input alive, which made one 200 MB document need 21 GB. (256 KiB: 10 MB of text tokenized
#: in 180 MB peak RSS against 330 MB with 1 MiB pieces, at the same speed.)
TOKENIZE_PIECE_CHARS = 1 << 18


def encode_documents(tokenizer: Tokenizer, texts: list[str], dtype: np.dtype,
                     ends: list[bool] | None = None) -> tuple[np.ndarray, int, np.ndarray]:
    """Token ids of `texts`, each followed by EOS, concatenated; their UTF-8 bytes; tokens per text.

    Texts are tokenized in calls of about `TOKENIZE_PIECE_CHARS` characters (long texts in
    whitespace-cut pieces, identical tokens), through tiktoken where it gives the tokenizer's own
    ids (`rank_bpe.encode_texts`), so memory does not grow with a document's size
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
        for piece_ids, k in zip(encode_texts(tokenizer, group), owners, strict=True):
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


def _save_splits(buffers: dict[str, list], flush: Callable[[str], None], parts: dict[str, list[np.ndarray]],
                 dtype: np.dtype, work: WorkFolder, stem: Path) -> None:
    """Tokenize what each split's buffer still holds, then save each split's ids as `STEM.SPLIT.npy`."""
    for split in SPLITS:
        if buffers[split]:
            flush(split)
    for split in SPLITS:
        arr = np.concatenate(parts[split]) if parts[split] else np.zeros(0, dtype)
        work.save_npy(stem.with_name(f"{stem.name}.{split}.npy"), arr)


def encode_task(task: dict[str, Any]) -> dict[str, Any]:
    """Tokenize one curated shard into per-split id arrays (`ENC/NNNNN.npz`) and counts (`.json`)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    work, i = WorkFolder(task["work"]), task.get("shard", task["index"])
    out = Path(task["out"])
    name = task.get("name", f"{i:05d}")
    tokenizer = Tokenizer.from_file(task["tokenizer"], task.get("eos_token"))
    dtype = np.dtype(task["dtype"])
    mask = work.drop_mask(task["mask_step"], i) if task["mask_step"] else None
    rule = SplitRule(task["seed"], task["val_fraction"], task["test_fraction"])
    moved = task["moved"]
    parts: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    counts = {s: {"documents": 0, "bytes": 0, "tokens": 0} for s in SPLITS}
    tok_lens: list[np.ndarray] = []
    char_lens: list[int] = []
    buffers: dict[str, list[str]] = {s: [] for s in SPLITS}
    labels: dict[str, list[str]] = {s: [] for s in SPLITS}
    val_languages: dict[str, dict[str, int]] = {}
    sizes = {s: 0 for s in SPLITS}

    def flush(split: str) -> None:
        texts = buffers[split]
        ids, nbytes, lengths = encode_documents(tokenizer, texts, dtype)
        if split == "val":
            add_language_counts(val_languages, texts, labels[split], lengths)
        labels[split] = []
        parts[split].append(ids)
        c = counts[split]
        c["documents"] += len(texts)
        c["bytes"] += nbytes
        c["tokens"] += int(ids.size)
        tok_lens.append(lengths)
        buffers[split], sizes[split] = [], 0

    cuts = task.get("cuts") or {}
    for _, d in work.documents(i, mask, ("id", "key", "text", "language")):
        if d["key"] in cuts:
            pieces = cut_pieces(d["text"], cuts[d["key"]])
        else:
            pieces = [(moved.get(d["key"]) or rule.assign(d["key"]), d["text"])]
        for split, text in pieces:
            buffers[split].append(text)
            labels[split].append(d["language"] or UNDETERMINED)
            char_lens.append(len(text))
            sizes[split] += len(text)
            if sizes[split] >= BATCH_CHARS or len(buffers[split]) >= BATCH_DOCS:
                flush(split)
    _save_splits(buffers, flush, parts, dtype, work, out / name)
    result = {"splits": counts,
              "hist_tokens": histogram(np.concatenate(tok_lens) if tok_lens else np.zeros(0, np.int64)),
              "hist_characters": histogram(np.array(char_lens, dtype=np.int64)), "pid": os.getpid(),
              "val_languages": val_languages}
    work.write_json(out / f"{name}.json", result)
    return result


#: the language of a document no langid step labelled (ISO 639-2 "und", undetermined).
UNDETERMINED = "und"


def add_language_counts(acc: dict[str, dict[str, int]], texts: list[str], languages: list[str],
                        lengths: np.ndarray) -> None:
    """Add documents, characters, UTF-8 bytes and tokens (EOS excluded; `lengths`, one per text)
    of `texts` into `acc[language]`."""
    for text, lang, n_tokens in zip(texts, languages, lengths.tolist(), strict=True):
        c = acc.setdefault(lang, {"documents": 0, "characters": 0, "bytes": 0, "tokens": 0})
        c["documents"] += 1
        c["characters"] += len(text)
        c["bytes"] += len(text.encode("utf-8", "surrogatepass"))
        c["tokens"] += int(n_tokens)


def language_rates(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per language of the val split (the langid label, `UNDETERMINED` without one): documents,
    characters, bytes and tokens summed over the shards' encode `results`, with bytes_per_token
    and characters_per_token (4 places; EOS tokens not counted). Documents tokenized in windows
    (one huge document) are not counted."""
    total: dict[str, dict[str, Any]] = {}
    for r in results:
        for lang, c in (r.get("val_languages") or {}).items():
            t = total.setdefault(lang, {"documents": 0, "characters": 0, "bytes": 0, "tokens": 0})
            for k in t:
                t[k] += c[k]
    for t in total.values():
        t["bytes_per_token"] = round(t["bytes"] / t["tokens"], 4) if t["tokens"] else None
        t["characters_per_token"] = round(t["characters"] / t["tokens"], 4) if t["tokens"] else None
    return dict(sorted(total.items()))


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
    from gptforge.data.windows import ShardText

    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    work = WorkFolder(task["work"])
    out = Path(task["out"])
    tokenizer = Tokenizer.from_file(task["tokenizer"], task.get("eos_token"))
    dtype = np.dtype(task["dtype"])
    text = ShardText(work.curated(task["shard"]))
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
    name = task["name"]
    _save_splits(buffers, flush, parts, dtype, work, out / name)
    result = {"splits": counts, "hist_tokens": histogram(np.array(whole_tokens, np.int64)),
              "hist_characters": histogram(np.array(whole_chars, np.int64)), "partials": partials, "pid": os.getpid()}
    work.write_json(out / f"{name}.json", result)
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


def _encode_tasks(common: dict[str, Any], work: WorkFolder, masks: list, splits: Splits,
                  mask_step: str | None) -> tuple[list[dict[str, Any]], list[list[str]]]:
    """The tokenize phase's tasks, and per shard the names of its result files in order.

    A shard is one `encode_task` (files `NNNNN.*`), or, when its kept text is over twice
    `ENCODE_WINDOW_BYTES`, one `encode_window_task` per window (`NNNNN.wKKKKofMMMM.*`).
    """
    from gptforge.data.windows import ShardText, plan_encode_windows

    tasks: list[dict[str, Any]] = []
    names: list[list[str]] = []
    rule = splits.rule
    for i, mask in enumerate(masks):
        windows = plan_encode_windows(ShardText(work.curated(i)), mask, splits.split_of, splits.cuts,
                                      ENCODE_WINDOW_BYTES)
        if windows is None:
            names.append([f"{i:05d}"])
            tasks.append({**common, "fn": "shard", "index": len(tasks), "shard": i, "name": f"{i:05d}",
                          "mask_step": mask_step, "moved": splits.moved, "seed": rule.seed,
                          "val_fraction": rule.val_fraction, "test_fraction": rule.test_fraction,
                          "cuts": splits.cuts})
            continue
        names.append([f"{i:05d}.w{k:04d}of{len(windows):04d}" for k in range(len(windows))])
        for name, spans in zip(names[-1], windows, strict=True):
            tasks.append({**common, "fn": "window", "index": len(tasks), "shard": i, "name": name, "spans": spans})
    return tasks, names


def _encode_any(task: dict[str, Any]) -> dict[str, Any]:
    """`encode_task` or `encode_window_task`, as the task says (one pool phase runs both)."""
    return encode_window_task(task) if task["fn"] == "window" else encode_task(task)


@dataclass
class Encoded:
    """The encode phase's output."""

    folder: Path  # encode-KEY/ of the work folder
    names: list[list[str]]  # per curated shard, its result names (one, or one per window) in order
    results: list[dict[str, Any]]  # per curated shard, its counts and histograms (windows merged)
    tasks: int  # tasks run (a windowed shard counts one per window)


def run_encode(tokenizer: Tokenizer, tok_path: Path, work: WorkFolder, masks: list, splits: Splits,
               mask_step: str | None, pool: Executor, progress: Any) -> Encoded:
    """Phase 4 (see the module docstring); `mask_step`: the corpus step whose drop masks apply."""
    rule = splits.rule
    key = hashlib.sha256(json.dumps([tokenizer.sha256, rule.seed, rule.val_fraction, rule.test_fraction,
                                     sorted(splits.moved.items()), sorted(splits.cuts.items()),
                                     ENCODE_WINDOW_BYTES]).encode()).hexdigest()[:12]
    enc = work.encode_dir(key)
    common = {"work": str(work.root), "out": str(enc), "tokenizer": str(tok_path), "eos_token": tokenizer.eos_token,
              "dtype": dtype_for_vocab(tokenizer.vocab_size).name}
    tasks, names = _encode_tasks(common, work, masks, splits, mask_step)
    run_tasks(_encode_any, tasks, lambda k: (enc / f"{tasks[k]['name']}.json").exists(), pool, progress, "tokenize")
    results = []
    for shard_names in names:
        parts = [json.loads((enc / f"{n}.json").read_text()) for n in shard_names]
        results.append(parts[0] if len(parts) == 1 and "partials" not in parts[0] else merge_windows(parts))
    return Encoded(enc, names, results, len(tasks))
