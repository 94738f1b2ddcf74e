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
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gptforge.data.readers import Document

if TYPE_CHECKING:
    from gptforge.data.phases.work import WorkFolder


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
    counter = LineCounter(min_line_chars)
    counter.add(texts)
    a = counter.arrays()
    return a["keys"], a["counts"], counter.documents


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
        lines = doc.text.split("\n")
        kept = [ln for ln in lines if len(ln.strip()) < self.min_line_chars or line_key(ln) not in self.keys]
        if len(kept) == len(lines):
            return doc
        self.counts["lines_removed"] += len(lines) - len(kept)
        text = "\n".join(kept)
        if not text.strip():
            return "only_boilerplate"
        return replace(doc, text=text)


class LineCounter:
    """`KeyCounter` of the boilerplate step: document frequencies of one shard's lines."""

    def __init__(self, min_line_chars: int):
        self.min_line_chars = min_line_chars
        self.counter: Counter = Counter()
        self.documents = 0

    def add(self, texts: Iterable[str]) -> None:
        for text in texts:
            self.documents += 1
            self.counter.update(document_line_keys(text, self.min_line_chars))

    def arrays(self) -> dict[str, np.ndarray]:
        """{"keys": uint64 (K,) sorted, "counts": int64 (K,)}."""
        if not self.counter:
            keys, counts = np.zeros(0, np.uint64), np.zeros(0, np.int64)
        else:
            keys = np.fromiter(self.counter.keys(), dtype=np.uint64, count=len(self.counter))
            counts = np.fromiter(self.counter.values(), dtype=np.int64, count=len(self.counter))
            order = np.argsort(keys)
            keys, counts = keys[order], counts[order]
        return {"keys": keys, "counts": counts}


@dataclass
class BoilerplateConfig:
    """The boilerplate-line step, a `CorpusStep` (`gptforge.data.steps`).

    A line (at least `min_line_chars` long) held by at least max(`min_documents`,
    `min_fraction` * documents) documents is removed everywhere: the steps before it are run in a
    key pass that counts line document frequencies per shard (`LineCounter`), `decide` merges them
    into `boilerplate/keys.npy`, and `BoilerplateLines` removes those lines in the step's place.
    """

    min_documents: int = 10
    min_fraction: float = 0.001
    min_line_chars: int = 10
    name: str = field(default="boilerplate", init=False, repr=False)
    drops_by_mask: bool = field(default=False, init=False, repr=False)
    key_pass: str = field(default="count lines", init=False, repr=False)

    def threshold(self, documents: int) -> int:
        """Documents a line must appear in to count as boilerplate."""
        return max(int(self.min_documents), int(-(-self.min_fraction * documents // 1)))

    def key_counter(self) -> LineCounter:
        return LineCounter(self.min_line_chars)

    def decide(self, work: WorkFolder, keys: list[dict[str, Path]], documents: list[int]) -> dict[str, Any]:
        """Merge the shards' line counts into the boilerplate keys; returns the report's counts."""
        n_docs = sum(documents)
        threshold = self.threshold(n_docs)
        frequent = merge_frequent([(k["keys"], k["counts"]) for k in keys], threshold)
        work.save_npy(work.step_dir(self.name) / "keys.npy", frequent)
        return {"documents_counted": n_docs, "threshold_documents": threshold, "boilerplate_lines": int(frequent.size)}

    def applier(self, work: WorkFolder) -> BoilerplateLines:
        keys = np.load(work.step_dir(self.name) / "keys.npy")
        return BoilerplateLines(frozenset(int(k) for k in keys), self.min_line_chars)
