"""Contamination check: which evaluation examples share a token n-gram with the training split.

The GPT-3 paper (Brown et al. 2020, appendix C) flags an example when any of its 13-grams occurs
in the training data. Here the n-grams are of token ids (the data's own tokenizer), n = 13 by
default. An example's text is what a model would have memorised: its context and its gold
continuation (multiple choice, classification, cloze) or its prompt and first answer (generation).

Scaling: the set that is held in memory is the evaluation side's n-gram hashes (a sorted uint64
array; a few per example token), and the training split is read once, streaming, in chunks of
`chunk_tokens` tokens; each chunk's rolling hashes are filtered by a 2^24-entry table of the
wanted hashes' top bits and the survivors looked up in that array by binary search, so memory is O(evaluation tokens + chunk) whatever the training size, and
the time one linear pass. Hashes are polynomial rolling hashes mod 2^64 (Karp and Rabin 1987);
a false match needs a 64-bit collision. Examples shorter than n tokens cannot match and are
counted as `too_short`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gptforge.errors import InputError
from gptforge.progress import progress as show_progress

_BASE = np.uint64(0x100000001B3)  # FNV-1a 64-bit prime, odd: a good multiplier mod 2^64


def ngram_hashes(tokens: np.ndarray, n: int) -> np.ndarray:
    """Rolling hashes (uint64, len - n + 1) of every n-gram of the 1-D token array."""
    t = np.asarray(tokens).astype(np.uint64) + np.uint64(1)  # token 0 must still count
    m = len(t) - n + 1
    if m <= 0:
        return np.zeros(0, dtype=np.uint64)
    h = np.zeros(m, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            h = h * _BASE + t[j:j + m]
    return h


@dataclass
class ContaminationReport:
    """Per task: `contaminated` example indices (into the task's examples), and counts."""

    n: int
    split: str
    train_tokens: int
    contaminated: dict[str, list[int]]
    too_short: dict[str, int]

    def as_dict(self, lines: dict[str, list[int]] | None = None) -> dict:
        out: dict[str, Any] = {"ngram": self.n, "split": self.split, "train_tokens": self.train_tokens, "tasks": {}}
        for name, idx in self.contaminated.items():
            rec = {"contaminated": len(idx), "too_short": self.too_short[name], "examples": idx}
            if lines is not None:
                rec["lines"] = [lines[name][i] for i in idx]
            out["tasks"][name] = rec
        return out


def find_contamination(example_tokens: dict[str, Sequence[Sequence[int]]], data_dir: str | Path, n: int = 13,
                       split: str = "train", chunk_tokens: int = 1 << 22,
                       on_chunk: Callable[[int], None] | None = None, progress: bool = False) -> ContaminationReport:
    """Indices of the examples (per task) that share a token n-gram with `split` of `data_dir`.

    example_tokens: {task: [token ids of each example's text]}, encoded with the data's tokenizer.
    on_chunk: called with the number of training tokens read after each chunk.
    progress: show the scan's progress (`gptforge.progress`: a bar on a terminal, log lines otherwise).

    Raises:
        InputError: n < 1, the split is empty, or not a shard folder (see
            `gptforge.data.shards.load_meta`). FileNotFoundError: no folder or meta.json.
    """
    from gptforge.data.shards import load_meta

    if n < 1:
        raise InputError(f"--contamination-ngram must be >= 1, got {n}")
    try:
        meta = load_meta(data_dir)
    except ValueError as e:  # not JSON / not a shard folder; the message names meta.json
        raise InputError(f"--contamination: {e}") from None
    info = meta["splits"].get(split)
    if not info or not info.get("tokens"):
        raise InputError(f"{Path(data_dir) / 'meta.json'}: split {split!r} is empty; nothing to check against")
    per_example, too_short = {}, {}
    all_hashes = []
    for task, exs in example_tokens.items():
        hs = [np.unique(ngram_hashes(np.asarray(e, dtype=np.int64), n)) for e in exs]
        per_example[task] = hs
        too_short[task] = sum(len(e) < n for e in exs)
        all_hashes.extend(hs)
    wanted = np.unique(np.concatenate(all_hashes)) if all_hashes else np.zeros(0, dtype=np.uint64)
    seen = np.zeros(len(wanted), dtype=bool)
    # A 2^24-entry table of the wanted hashes' top bits rejects almost every training n-gram with
    # one lookup; only the few that pass are binary-searched.
    top = np.zeros(1 << 24, dtype=bool)
    top[wanted >> np.uint64(40)] = True
    itemsize = np.dtype(meta["dtype"]).itemsize
    total = 0
    with show_progress("contamination check", info["tokens"], "train tokens", enabled=progress) as bar:
        for name in info["files"]:
            path = Path(data_dir) / name
            length = path.stat().st_size // itemsize
            with open(path, "rb") as fh:  # plain reads, not a memory map: resident memory stays one chunk
                start = 0
                while start + n <= length:
                    stop = min(length, start + chunk_tokens + n - 1)  # chunks overlap by n - 1 tokens
                    fh.seek(start * itemsize)
                    h = ngram_hashes(np.fromfile(fh, dtype=meta["dtype"], count=stop - start), n)
                    h = h[top[h >> np.uint64(40)]]
                    if len(h) and len(wanted):
                        pos = np.searchsorted(wanted, h)
                        pos[pos == len(wanted)] = 0
                        seen[pos[wanted[pos] == h]] = True
                    bar.update(completed=total + stop)
                    if on_chunk is not None:
                        on_chunk(total + stop)
                    if stop == length:
                        break
                    start = stop - (n - 1)
            total += length
    found = set(wanted[seen].tolist())
    contaminated = {task: [i for i, hs in enumerate(exs) if any(int(x) in found for x in hs.tolist())]
                    for task, exs in per_example.items()}
    return ContaminationReport(n=n, split=split, train_tokens=total, contaminated=contaminated, too_short=too_short)
