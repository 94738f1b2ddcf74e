"""Line-level boilerplate removal: lines that repeat across many documents of the corpus.

Navigation menus, cookie notices, licence headers and "Share this article" lines recur
verbatim in thousands of pages; they carry no content and teach a model to emit them. The rule
(as in Dolma's and MassiveWeb's cross-document line deduplication, Soldaini et al. 2024 §3.1;
Rae et al. 2021 App. A.1.1) is global: count, for each distinct line, the number of documents
holding it, and remove the lines held by at least `max(min_documents, min_fraction * N)` of the
N documents. Lines shorter than `min_line_chars` (blank lines, "}", "* * *") are never
counted: they repeat everywhere and removing them would only damage formatting.

Counting is done per input shard (sorted unique 64-bit line hashes with document counts, one
`.npy` pair per shard on disk) and merged by hash range, so memory holds one range of the hash
space at a time, not every distinct line of the corpus.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import numpy as np

from gptforge.data.readers import Document


def line_key(line: str) -> int:
    """Stable 64-bit hash of a line with outer whitespace removed (same in every process)."""
    return int.from_bytes(hashlib.blake2b(line.strip().encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def document_line_keys(text: str, min_line_chars: int) -> set[int]:
    """The distinct keys of `text`'s lines that are at least `min_line_chars` long (stripped)."""
    return {line_key(ln) for ln in text.split("\n") if len(ln.strip()) >= min_line_chars}


def count_lines(texts: Iterable[str], min_line_chars: int = 10) -> tuple[np.ndarray, np.ndarray, int]:
    """Document frequency of every counted line.

    Returns (keys uint64 (K,) sorted, counts int64 (K,), number of documents seen).
    """
    counter: Counter = Counter()
    n = 0
    for text in texts:
        n += 1
        counter.update(document_line_keys(text, min_line_chars))
    if not counter:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64), n
    keys = np.fromiter(counter.keys(), dtype=np.uint64, count=len(counter))
    counts = np.fromiter(counter.values(), dtype=np.int64, count=len(counter))
    order = np.argsort(keys)
    return keys[order], counts[order], n


def merge_frequent(parts: Sequence[tuple[Path, Path]], min_count: int, ranges: int = 16) -> np.ndarray:
    """Keys whose summed count over all parts is >= `min_count`.

    Args:
        parts: (keys.npy, counts.npy) per shard, keys sorted ascending (as `count_lines` returns).
        min_count: documents a line must appear in to be boilerplate.
        ranges: the hash space is merged in this many slices to bound memory.

    Returns: sorted uint64 array of boilerplate line keys.
    """
    maps = [(np.load(k, mmap_mode="r"), np.load(c, mmap_mode="r")) for k, c in parts]
    edges = [(2**64 * k) // ranges for k in range(ranges + 1)]
    found = []
    for lo, hi in pairwise(edges):
        ks, cs = [], []
        for keys, counts in maps:
            a = int(np.searchsorted(keys, np.uint64(lo)))
            b = len(keys) if hi >= 2**64 else int(np.searchsorted(keys, np.uint64(hi)))
            ks.append(np.asarray(keys[a:b]))
            cs.append(np.asarray(counts[a:b]))
        if not ks:
            continue
        k = np.concatenate(ks)
        if not k.size:
            continue
        c = np.concatenate(cs)
        uniq, inv = np.unique(k, return_inverse=True)
        total = np.bincount(inv, weights=c).astype(np.int64)
        found.append(uniq[total >= min_count])
    return np.concatenate(found) if found else np.zeros(0, np.uint64)


@dataclass
class BoilerplateLines:
    """Remove the lines whose key is in `keys` (from `merge_frequent`); drop emptied documents.

    `counts["lines_removed"]` counts removed lines; a document left with only whitespace is
    dropped with reason "only_boilerplate".
    """

    keys: frozenset[int] = frozenset()
    min_line_chars: int = 10
    name: str = "boilerplate"
    counts: Counter = field(default_factory=Counter, repr=False)

    def __call__(self, doc: Document) -> Document | str:
        if not self.keys:
            return doc
        lines = doc["text"].split("\n")
        kept = [ln for ln in lines if len(ln.strip()) < self.min_line_chars or line_key(ln) not in self.keys]
        if len(kept) == len(lines):
            return doc
        self.counts["lines_removed"] += len(lines) - len(kept)
        text = "\n".join(kept)
        if not text.strip():
            return "only_boilerplate"
        return {**doc, "text": text}
