"""Exact and near-duplicate detection: content hashes and MinHash LSH with union-find clusters.

Exact: a 64-bit BLAKE2b hash of the document's normalized text; documents with equal hashes
are one cluster.

Near: MinHash (Broder 1997) over word n-gram shingles, signatures computed by `rensa`
(`RMinHash`, Rust), then locality-sensitive hashing (Leskovec, Rajaraman, Ullman, "Mining of
Massive Datasets", section 3.4): the signature is cut into `bands` bands of `rows` rows; two
documents are candidates when any band is equal. With Jaccard similarity s the probability of
becoming candidates is

    P(s) = 1 - (1 - s**rows) ** bands

FineWeb's setting (Penedo et al. 2024, section 3.4) is word 5-grams, 14 bands x 8 rows = 112
permutations: P(0.75) ~ 0.77, P(0.8) ~ 0.92, P(0.7) ~ 0.56, P(0.6) ~ 0.22. The 50% point is
near (1/bands)**(1/rows) ~ 0.72. (datasketch's `MinHashLSH(threshold=...)` picks bands and rows
minimizing a weighted sum of false positive and negative areas; its `threshold` is not where
P = 0.5.)

Candidate pairs are joined with union-find; each cluster keeps the document with the smallest
global index (its position in the deterministic input order), so the result does not depend on
how the corpus was split among workers.

Scale: band hashes are 8 bytes per band per document and are processed one band at a time
(a sort of one column), so memory is ~16 bytes per document per band plus the union-find
array, never the text or the full signatures.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import numpy as np

from gptforge.data.text_stats import words

_MASK64 = (1 << 64) - 1


def exact_hash(text: str) -> int:
    """64-bit content hash of a document (BLAKE2b over its UTF-8 text, outer whitespace ignored)."""
    return int.from_bytes(hashlib.blake2b(text.strip().encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def shingles(text: str, n: int = 5) -> list[str]:
    """Word n-grams of the lower-cased `text` joined by spaces (CJK: character n-grams).

    A text with fewer than n words gives one shingle (all its words), so short documents
    still get a signature and exact-short duplicates still match.
    """
    ws = words(text.lower())
    if len(ws) <= n:
        return [" ".join(ws)]
    return [" ".join(ws[i:i + n]) for i in range(len(ws) - n + 1)]


def shingle_hashes(text: str, n: int = 5) -> np.ndarray:
    """64-bit hashes of the lower-cased word n-grams of `text` (the set `shingles` would give).

    Words are hashed by rensa (`RMinHash.hash_token_sets`, the same hash its `update` applies to
    strings), then each n-gram's hash is chained over its words' hashes with numpy, so no
    n-gram string is ever built. Fewer than n words give one shingle of all of them.

    Returns: (max(1, words - n + 1),) uint64.
    """
    from rensa import RMinHash

    ws = words(text.lower()) or [""]
    h = np.array(RMinHash.hash_token_sets([ws])[0], dtype=np.uint64)
    m = min(n, len(h))
    with np.errstate(over="ignore"):
        g = h[:len(h) - m + 1].copy()
        for k in range(1, m):
            g = _mix64(g * np.uint64(0x9E3779B97F4A7C15) + h[k:len(h) - m + 1 + k])
    return g


def _mix64(h: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer (Steele et al. 2014) on uint64, wrapping."""
    with np.errstate(over="ignore"):
        h = h ^ (h >> np.uint64(30))
        h = h * np.uint64(0xBF58476D1CE4E5B9)
        h = h ^ (h >> np.uint64(27))
        h = h * np.uint64(0x94D049BB133111EB)
        return h ^ (h >> np.uint64(31))


def minhash_signatures(texts: Sequence[str], num_perm: int = 112, ngram: int = 5, seed: int = 1) -> np.ndarray:
    """MinHash signatures of `texts` over word n-gram shingles (`shingle_hashes`).

    One rensa call for the whole batch (`RMinHash.digest_matrix_from_flat_token_hashes`, Rust):
    the per-text Python work is only word splitting.

    Returns: array of shape (len(texts), num_perm), dtype uint32.
    """
    from rensa import RMinHash

    if not len(texts):
        return np.zeros((0, num_perm), dtype=np.uint32)
    parts = [shingle_hashes(t, ngram) for t in texts]
    offsets = np.zeros(len(parts) + 1, dtype=np.uint64)
    np.cumsum([len(p) for p in parts], out=offsets[1:])
    matrix = RMinHash.digest_matrix_from_flat_token_hashes(np.concatenate(parts), offsets, num_perm=num_perm,
                                                           seed=seed)
    return np.array(matrix.to_rows(), dtype=np.uint32).reshape(len(texts), num_perm)


# Odd 64-bit multipliers (fixed, from a seeded generator) to mix the rows of a band into one key.
_MULT = np.random.default_rng(20240601).integers(1, 2**63, size=64, dtype=np.uint64) | np.uint64(1)


def band_hashes(signatures: np.ndarray, bands: int = 14, rows: int = 8) -> np.ndarray:
    """One 64-bit key per band: equal keys <=> (with overwhelming probability) equal bands.

    Args:
        signatures: (N, bands * rows) uint32 MinHash signatures.

    Returns: (N, bands) uint64; column b of different bands are also made distinct by mixing in
        the band index, so keys may be stored together.

    Raises:
        ValueError: the signature width is not bands * rows.
    """
    n, width = signatures.shape
    if width != bands * rows:
        raise ValueError(f"signatures have {width} values, expected bands * rows = {bands} * {rows}")
    if rows > len(_MULT):
        raise ValueError(f"at most {len(_MULT)} rows per band")
    sig = signatures.reshape(n, bands, rows).astype(np.uint64)
    with np.errstate(over="ignore"):
        h = (sig * _MULT[:rows]).sum(axis=2, dtype=np.uint64)
        h ^= np.arange(bands, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        # splitmix64 finalizer: spreads the sum's bits so that sorting groups only true equals.
        h ^= h >> np.uint64(30)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(27)
        h *= np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(31)
    return h


class UnionFind:
    """Disjoint sets over 0..n-1 with path halving; the root of a set is its smallest member."""

    def __init__(self, n: int):
        self.parent = np.arange(n, dtype=np.int64)

    def find(self, x: int) -> int:
        p = self.parent
        while p[x] != x:
            p[x] = p[p[x]]
            x = int(p[x])
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            if ra < rb:
                self.parent[rb] = ra
            else:
                self.parent[ra] = rb

    def roots(self) -> np.ndarray:
        """Root (smallest member) of every element's set, shape (n,)."""
        return np.array([self.find(i) for i in range(len(self.parent))], dtype=np.int64)


def union_equal_keys(uf: UnionFind, keys: np.ndarray, index: np.ndarray | None = None) -> int:
    """Join every group of equal `keys` (1-D) in `uf`; `index[i]` is the element of keys[i].

    Returns the number of union operations (candidate edges).
    """
    index = np.arange(len(keys)) if index is None else index
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    same = np.flatnonzero(sk[1:] == sk[:-1])
    for i in same:
        uf.union(int(index[order[i]]), int(index[order[i + 1]]))
    return len(same)


def duplicate_mask(exact: np.ndarray | None = None, bands: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Which documents to drop, keeping the smallest index of each cluster.

    Args:
        exact: (N,) uint64 exact content hashes (or None).
        bands: (N, B) uint64 band keys from `band_hashes` (or None).

    Returns:
        (drop, cluster): bool (N,) True for documents to remove; int64 (N,) the kept
        representative (cluster root) of each document.
    """
    n = len(exact) if exact is not None else len(bands)  # type: ignore[arg-type]
    uf = UnionFind(n)
    if exact is not None:
        union_equal_keys(uf, np.asarray(exact))
    if bands is not None:
        for b in range(bands.shape[1]):
            union_equal_keys(uf, np.ascontiguousarray(bands[:, b]))
    roots = uf.roots()
    return roots != np.arange(n), roots


def candidate_probability(s: float | np.ndarray, bands: int = 14, rows: int = 8):
    """P(two documents with Jaccard similarity s share a band) = 1 - (1 - s^rows)^bands (MMDS 3.4)."""
    return 1.0 - (1.0 - np.asarray(s, dtype=float) ** rows) ** bands


def cluster_sizes(roots: Iterable[int]) -> dict[int, int]:
    """{cluster size: number of clusters} for clusters of 2 or more documents."""
    counts = np.bincount(np.asarray(list(roots), dtype=np.int64))
    sizes = counts[counts > 1]
    values, freq = np.unique(sizes, return_counts=True)
    return {int(v): int(f) for v, f in zip(values, freq)}
