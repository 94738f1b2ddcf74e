"""Exact and near-duplicate detection: content hashes and MinHash LSH with union-find clusters.

Exact: a 64-bit BLAKE2b hash of the document's normalized text; documents with equal hashes
are one cluster.

Near: MinHash (Broder 1997) over word n-gram shingles of FineWeb's simplified text (lower
case, numbers to "0", no punctuation or diacritics: `dedup_words`; a document with fewer than n
words has no signature and is never a near duplicate, as in FineWeb/datatrove), signatures
computed by `rensa` (`RMinHash`, Rust), then locality-sensitive hashing (Leskovec, Rajaraman, Ullman, "Mining of
Massive Datasets", section 3.4): the signature is cut into `bands` bands of `rows` rows; two
documents are candidates when any band is equal. With Jaccard similarity s the probability of
becoming candidates is

    P(s) = 1 - (1 - s**rows) ** bands

FineWeb's setting (Penedo et al. 2024, section 3.4) is word 5-grams, 14 bands x 8 rows = 112
permutations: P(0.75) ~ 0.77, P(0.8) ~ 0.92, P(0.7) ~ 0.56, P(0.6) ~ 0.22. The 50% point is
near (1/bands)**(1/rows) ~ 0.72. (datasketch's `MinHashLSH(threshold=...)` picks bands and rows
minimizing a weighted sum of false positive and negative areas; its `threshold` is not where
P = 0.5.)

Two hash families (rensa's here, datatrove's xxhash + universal hashing) decide pairs near the
threshold differently by chance: on a corpus with many documents at Jaccard 0.4-0.7 (the
standard library's generated codec tables) datatrove agrees with itself under another seed on
only ~97.7% of keep decisions. Run on datatrove's own signatures, the banding and union-find
here reproduce its clusters exactly (bench/prepare_throughput.py measures both).

Candidate pairs are joined with union-find; each cluster keeps the document with the smallest
global index (its position in the deterministic input order), so the result does not depend on
how the corpus was split among workers.

Scale: band hashes are 8 bytes per band per document and are processed one band at a time
(a sort of one column), so memory is ~16 bytes per document per band plus the union-find
array, never the text or the full signatures.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gptforge.data.steps import StepStats
from gptforge.data.text_stats import CJK_CLASS, mix64, words

if TYPE_CHECKING:
    from gptforge.data.phases.work import WorkFolder

#: MinHash value of the empty set (the minimum over nothing).
EMPTY_MINHASH = np.uint32(0xFFFFFFFF)
#: band key of a document without shingles: never a candidate (`union_equal_keys` skips it).
NO_KEY = np.uint64(0)


def exact_hash(text: str) -> int:
    """64-bit content hash of a document (BLAKE2b over its UTF-8 text, outer whitespace ignored)."""
    return int.from_bytes(hashlib.blake2b(text.strip().encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


# --------------------------------------------------------------------------------------------
# Text simplification before shingling (FineWeb / datatrove)
# --------------------------------------------------------------------------------------------

#: a run of digits, with at most one decimal separator inside, becomes "0" (FineWeb).
_NUMBER = re.compile(r"\d+(?:[.,\u060c\u066b\u2396\u2397\u2398]\d+)?")
_simplify_res: tuple[re.Pattern, re.Pattern] | None = None
#: ASCII text: every character but letters and digits becomes a space (str.translate's fast path).
_ASCII_SEPARATORS = str.maketrans({chr(c): " " for c in range(128) if not chr(c).isalnum()})


def _char_class(pred) -> str:
    """A regex character class body listing the code points for which `pred(category)` holds.

    Scans planes 0, 1 and 14 only: the other planes hold ideographs (Lo), private use and
    unassigned code points, none of them marks, punctuation or symbols (a test checks this
    against a full scan).
    """
    ranges: list[list[int]] = []
    for lo, hi in ((0, 0x20000), (0xE0000, 0xE1000)):
        for c in range(lo, hi):
            if pred(unicodedata.category(chr(c))):
                if ranges and ranges[-1][1] == c - 1:
                    ranges[-1][1] = c
                else:
                    ranges.append([c, c])
    return "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges)


def _simplify_patterns() -> tuple[re.Pattern, re.Pattern]:
    """(word pattern, non-spacing-mark pattern) for non-ASCII text, built once per process (~30 ms).

    A word is one CJK character, or a run of letters and digits (`str.isalnum`) that may hold
    spacing or enclosing marks (Mc, Me: vowel signs of Indic scripts) after its first
    character. Everything else separates: whitespace, punctuation, symbols, controls, "_".
    """
    global _simplify_res
    if _simplify_res is None:
        cjk = CJK_CLASS
        marks = _char_class(lambda cat: cat in ("Mc", "Me"))
        word = re.compile(f"[{cjk}]|[^\\W_{cjk}]+(?:[{marks}]+[^\\W_{cjk}]*)*")
        _simplify_res = (word, re.compile(f"[{_char_class(lambda cat: cat == 'Mn')}]+"))
    return _simplify_res


_nonspacing: dict[int, None] | None = None


def _nonspacing_table() -> dict[int, None]:
    """`str.translate` table deleting the non-spacing marks (Mn) that `_simplify_patterns`'s second
    pattern matches, built once per process: the same result ~4x faster on Chinese text (the
    pattern's class reaches beyond the BMP, where `re` tests ranges one by one; bench/RESULTS.md,
    issue 40)."""
    global _nonspacing
    if _nonspacing is None:
        _nonspacing = {c: None for lo, hi in ((0, 0x20000), (0xE0000, 0xE1000)) for c in range(lo, hi)
                       if unicodedata.category(chr(c)) == "Mn"}
    return _nonspacing


def dedup_words(text: str, simplify: bool = True) -> list[str]:
    """The words near-duplicate detection shingles, after FineWeb's text simplification.

    With `simplify` (the default), as datatrove's `simplify_text` does for FineWeb's MinHash
    (datatrove `utils/text.py`, `TextNormConfig` defaults; Penedo et al. 2024, section 3.4):
    lower case; every number (a digit run, optionally with one decimal part) becomes "0";
    punctuation and symbols become spaces; whitespace runs are one separator; diacritics are
    removed (NFD, then non-spacing marks dropped). Two documents that differ only in numbers,
    punctuation, spacing or accents thus have the same shingles.

    Differences from datatrove, on purpose: a word is a run of letters and digits (with spacing
    marks), so every other character separates words (datatrove replaces a hand-made list of
    punctuation with spaces, then runs spaCy's tokenizer, which in English also splits off
    symbols, units from numbers ("0kg") and contractions written without an apostrophe, which
    the simplification makes of "can't", "don't", "I'd": "cannot", "dont", "id"); Chinese and
    Japanese characters are one word each (`text_stats.words`), where spaCy's English tokenizer
    sees a whole unspaced run as one word. On the benchmark corpus (standard-library sources,
    Shakespeare) these splits are the only differences: 0.1% of words.

    Without `simplify`: the lower-cased `text_stats.words` (punctuation inside words such as
    "don't" kept, numbers kept).
    """
    if not simplify:
        return words(text.lower())
    text = _NUMBER.sub("0", text.lower())
    if text.isascii():
        return text.translate(_ASCII_SEPARATORS).split()
    word, _ = _simplify_patterns()
    return word.findall(unicodedata.normalize("NFD", text).translate(_nonspacing_table()))


def shingles(text: str, n: int = 5, simplify: bool = True, skip_short: bool = True) -> list[str]:
    """Word n-grams of `text` (words from `dedup_words`) joined by spaces.

    A text with fewer than n words has no shingle when `skip_short` (FineWeb/datatrove: such a
    document gets no MinHash signature and is never a near-duplicate; exact dedup still sees
    it); otherwise it gives one shingle of all its words.
    """
    ws = dedup_words(text, simplify)
    if len(ws) < n:
        return [] if skip_short else [" ".join(ws)]
    return [" ".join(ws[i:i + n]) for i in range(len(ws) - n + 1)]


def shingle_hashes(text: str, n: int = 5, simplify: bool = True, skip_short: bool = True) -> np.ndarray:
    """64-bit hashes of the word n-grams of `text` (the set `shingles` would give).

    Words are hashed by rensa (`RMinHash.hash_token_sets`, the same hash its `update` applies to
    strings), then each n-gram's hash is chained over its words' hashes with numpy, so no
    n-gram string is ever built.

    Returns: (words - n + 1,) uint64; with fewer than n words (0,) when `skip_short`, else (1,).
    """
    return _ngram_hashes(dedup_words(text, simplify), n, skip_short)


def _ngram_hashes(ws: list[str], n: int, skip_short: bool) -> np.ndarray:
    """`shingle_hashes` of a word list."""
    from rensa import RMinHash

    if len(ws) < n and skip_short:
        return np.zeros(0, dtype=np.uint64)
    h = np.array(RMinHash.hash_token_sets([ws or [""]])[0], dtype=np.uint64)
    m = min(n, len(h))
    with np.errstate(over="ignore"):
        g = h[:len(h) - m + 1].copy()
        for k in range(1, m):
            g = mix64(g * np.uint64(0x9E3779B97F4A7C15) + h[k:len(h) - m + 1 + k])
    return g


def minhash_signatures(texts: Sequence[str], num_perm: int = 112, ngram: int = 5, seed: int = 1,
                       simplify: bool = True, skip_short: bool = True) -> np.ndarray:
    """MinHash signatures of `texts` over word n-gram shingles (`shingle_hashes`).

    One rensa call for the whole batch (`RMinHash.digest_matrix_from_flat_token_hashes`, Rust):
    the per-text Python work is only word splitting. A text without shingles (fewer than
    `ngram` words with `skip_short`) gets the empty set's signature, every value 2**32 - 1,
    which `band_hashes` turns into "no candidate".

    Returns: array of shape (len(texts), num_perm), dtype uint32.
    """
    from rensa import RMinHash

    if not len(texts):
        return np.zeros((0, num_perm), dtype=np.uint32)
    long = [k for k, t in enumerate(texts) if len(t) > MINHASH_PIECE_CHARS]
    if long:
        sig = np.empty((len(texts), num_perm), dtype=np.uint32)
        short = [k for k, t in enumerate(texts) if len(t) <= MINHASH_PIECE_CHARS]
        if short:
            sig[short] = minhash_signatures([texts[k] for k in short], num_perm, ngram, seed, simplify, skip_short)
        for k in long:
            sig[k] = _streamed_signature(texts[k], num_perm, ngram, seed, simplify, skip_short)
        return sig
    parts = [shingle_hashes(t, ngram, simplify, skip_short) for t in texts]
    offsets = np.zeros(len(parts) + 1, dtype=np.uint64)
    np.cumsum([len(p) for p in parts], out=offsets[1:])
    flat = np.concatenate(parts)
    if not len(flat):
        return np.full((len(texts), num_perm), EMPTY_MINHASH, dtype=np.uint32)
    matrix = RMinHash.digest_matrix_from_flat_token_hashes(flat, offsets, num_perm=num_perm, seed=seed)
    sig = np.array(matrix.to_rows(), dtype=np.uint32).reshape(len(texts), num_perm)
    sig[offsets[1:] == offsets[:-1]] = EMPTY_MINHASH  # the library's value for an empty set, made explicit
    return sig


#: a text longer than this gets its MinHash signature streamed over whitespace-cut pieces.
MINHASH_PIECE_CHARS = 1 << 20


def _streamed_signature(text: str, num_perm: int, ngram: int, seed: int, simplify: bool,
                        skip_short: bool) -> np.ndarray:
    """The MinHash signature of one long text, computed piece by piece: (num_perm,) uint32.

    A set's MinHash is the element-wise minimum of its parts' signatures, so the signature of
    the whole shingle set is the minimum over pieces (`text_stats.whitespace_pieces`; words never
    span a cut), each piece's words preceded by the previous piece's last `ngram` - 1 words so
    that the n-grams across a cut are counted. Memory is bounded by one piece's shingles
    instead of the whole document's (28 bytes per character measured).
    """
    from rensa import RMinHash

    from gptforge.data.text_stats import whitespace_pieces

    sig: np.ndarray | None = None
    carry: list[str] = []
    seen_words = 0
    for piece in whitespace_pieces(text, MINHASH_PIECE_CHARS):
        new = dedup_words(piece, simplify)
        seen_words += len(new)
        ws = carry + new
        if len(ws) >= ngram:
            h = _ngram_hashes(ws, ngram, True)
            offsets = np.array([0, len(h)], dtype=np.uint64)
            row = np.array(RMinHash.digest_matrix_from_flat_token_hashes(h, offsets, num_perm=num_perm,
                                                                          seed=seed).to_rows(), dtype=np.uint32)
            row = row.reshape(num_perm)
            sig = row if sig is None else np.minimum(sig, row)
        carry = ws[max(0, len(ws) - (ngram - 1)):] if ngram > 1 else []
    if seen_words < ngram:  # a long text of few words: the short-text rule on the whole
        parts = _ngram_hashes(dedup_words(text, simplify), ngram, skip_short)
        if not len(parts):
            return np.full(num_perm, EMPTY_MINHASH, dtype=np.uint32)
        offsets = np.array([0, len(parts)], dtype=np.uint64)
        return np.array(RMinHash.digest_matrix_from_flat_token_hashes(parts, offsets, num_perm=num_perm,
                                                                      seed=seed).to_rows(),
                        dtype=np.uint32).reshape(num_perm)
    assert sig is not None
    return sig


# Odd 64-bit multipliers (fixed, from a seeded generator) to mix the rows of a band into one key.
_MULT = np.random.default_rng(20240601).integers(1, 2**63, size=64, dtype=np.uint64) | np.uint64(1)


def band_hashes(signatures: np.ndarray, bands: int = 14, rows: int = 8) -> np.ndarray:
    """One 64-bit key per band: equal keys <=> (with overwhelming probability) equal bands.

    Args:
        signatures: (N, bands * rows) uint32 MinHash signatures.

    Returns: (N, bands) uint64; column b of different bands are also made distinct by mixing in
        the band index, so keys may be stored together. A document whose signature is the empty
        set's (`EMPTY_MINHASH` everywhere) gets `NO_KEY` (0) in every band; no other key is 0.

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
    h[h == NO_KEY] = 1
    h[(signatures == EMPTY_MINHASH).all(axis=1)] = NO_KEY
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


def union_equal_keys(uf: UnionFind, keys: np.ndarray, index: np.ndarray | None = None, bands: bool = False) -> int:
    """Join every group of equal `keys` (1-D) in `uf`; `index[i]` is the element of keys[i].

    With `bands` (the keys are a column of `band_hashes`), `NO_KEY` (documents without a MinHash
    signature) joins nothing.
    Returns the number of union operations (candidate edges).
    """
    index = np.arange(len(keys)) if index is None else index
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    eq = sk[1:] == sk[:-1]
    if bands:
        eq &= sk[1:] != NO_KEY
    same = np.flatnonzero(eq)
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
    n = len(exact) if exact is not None else len(bands)
    uf = UnionFind(n)
    if exact is not None:
        union_equal_keys(uf, np.asarray(exact))
    if bands is not None:
        for b in range(bands.shape[1]):
            union_equal_keys(uf, np.ascontiguousarray(bands[:, b]), bands=True)
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
    return {int(v): int(f) for v, f in zip(values, freq, strict=True)}


class DedupKeys:
    """`KeyCounter` of the dedup step: exact hashes and MinHash band keys of one shard's documents."""

    def __init__(self, cfg: DedupConfig):
        self.cfg = cfg
        self.exact: list[int] = []
        self.bands: list[np.ndarray] = []

    def add(self, texts: Sequence[str]) -> None:
        cfg = self.cfg
        if cfg.exact:
            self.exact.extend(exact_hash(t) for t in texts)
        if cfg.near:
            sig = minhash_signatures(texts, cfg.bands * cfg.rows, cfg.ngram, cfg.seed, cfg.simplify, cfg.skip_short)
            self.bands.append(band_hashes(sig, cfg.bands, cfg.rows))

    def arrays(self) -> dict[str, np.ndarray]:
        """{"exact": uint64 (N,) or (0,), "bands": uint64 (N, bands) or (0, 0) without near dedup}."""
        width = self.cfg.bands if self.cfg.near else 0
        return {"exact": np.array(self.exact, dtype=np.uint64),
                "bands": np.concatenate(self.bands) if self.bands else np.zeros((0, width), np.uint64)}


@dataclass
class DedupConfig:
    """The deduplication step, a `CorpusStep` (`gptforge.data.steps`; FineWeb's defaults).

    `simplify`: shingle FineWeb's simplified text (lower case, numbers to 0, no punctuation or
    symbols, whitespace normalized, no diacritics; `dedup_words`) instead of the lower-cased
    words. `skip_short`: documents with fewer than `ngram` words get no MinHash signature and are
    never near-duplicates (FineWeb/datatrove), instead of one shingle of all their words. Exact
    dedup is unaffected by both. Its verdict is a drop mask per curated shard (`dedup/NNNNN.npy`),
    so it is the last step of a recipe.

    `threshold`: the Jaccard similarity of the shingle sets at which two documents become
    candidates with probability about 1/2; `bands` is then round((1/threshold) ** rows) (the
    inverse of the (1/bands) ** (1/rows) approximation in the module docstring), at least 1.
    None (default): `bands` as given (14 with 8 rows: 0.719). `near_dedup_record` (meta.json's
    `near_dedup`) gives the shingle unit and the threshold in force.

    Raises:
        ValueError: `threshold` outside (0, 1), or given together with a `bands` other than 14.
    """

    exact: bool = True
    near: bool = True
    ngram: int = 5
    bands: int = 14
    rows: int = 8
    seed: int = 1
    simplify: bool = True
    skip_short: bool = True
    threshold: float | None = None
    name: str = field(default="dedup", init=False, repr=False)
    drops_by_mask: bool = field(default=True, init=False, repr=False)
    key_pass: str = field(default="", init=False, repr=False)

    def __post_init__(self) -> None:
        if self.threshold is None:
            return
        if not 0 < float(self.threshold) < 1:
            raise ValueError(f"dedup: threshold must be a Jaccard similarity between 0 and 1, got {self.threshold!r}")
        if self.bands != 14:
            raise ValueError("dedup: give threshold or bands, not both (bands follows from threshold and rows)")
        self.bands = max(1, round((1 / float(self.threshold)) ** self.rows))

    def near_dedup_record(self) -> dict[str, Any]:
        """What near-duplicate detection compared, for meta.json: the shingle unit, n, the LSH
        bands and rows, and the similarity threshold in force ((1/bands) ** (1/rows), 4 places)."""
        unit = ("words of FineWeb's simplified text (dedup_words)" if self.simplify
                else "lower-cased words (text_stats.words)")
        return {"enabled": bool(self.near), "shingle": f"{self.ngram}-grams",
                "shingle_unit": unit + "; each Han character or kana is one word",
                "ngram": self.ngram, "bands": self.bands, "rows": self.rows,
                "similarity_threshold": round((1 / self.bands) ** (1 / self.rows), 4),
                "threshold_given": self.threshold, "skip_short": self.skip_short}

    def key_counter(self) -> DedupKeys:
        return DedupKeys(self)

    def applier(self, work: WorkFolder) -> None:
        return None

    def decide(self, work: WorkFolder, keys: list[dict[str, Path]], documents: list[int]) -> dict[str, Any]:
        """Drop masks for exact and near duplicates over all shards, keeping the first of each cluster.

        The kept document of a cluster is the one with the smallest global position (shard order,
        then position in shard), so the result does not depend on the worker count. Writes
        `dedup/NNNNN.npy` (bool drop mask per shard); returns the stats, cluster sizes and
        candidate pair counts.
        """
        offsets = np.concatenate([[0], np.cumsum(documents)]).astype(np.int64)
        n = int(offsets[-1])
        uf = UnionFind(n)
        exact_edges = near_edges = 0
        if self.exact and n:
            exact_edges = union_equal_keys(uf, np.concatenate([np.load(k["exact"]) for k in keys]))
        exact_roots = uf.roots() if n else np.zeros(0, np.int64)
        if self.near and n:
            maps = [np.load(k["bands"], mmap_mode="r") for k in keys]
            for b in range(self.bands):
                near_edges += union_equal_keys(uf, np.concatenate([np.asarray(m[:, b]) for m in maps]), bands=True)
        roots = uf.roots() if n else np.zeros(0, np.int64)
        idx = np.arange(n)
        drop = roots != idx
        out = work.step_dir(self.name)
        for i in range(len(keys)):
            work.save_npy(out / f"{i:05d}.npy", drop[offsets[i]:offsets[i + 1]])
        stats = self._stats(work, offsets, roots, drop, exact_roots != idx)
        return {"step": stats.to_dict(), "cluster_sizes": {str(k): v for k, v in cluster_sizes(roots).items()},
                "exact_candidate_pairs": exact_edges, "near_candidate_pairs": near_edges, "documents": n}

    def _stats(self, work: WorkFolder, offsets: np.ndarray, roots: np.ndarray, drop: np.ndarray,
               exact_dup: np.ndarray) -> StepStats:
        """Counts, characters and examples (the first few dropped of each kind, with the id kept)."""
        stats = StepStats(self.name)
        stats.documents_in = int(offsets[-1])
        stats.documents_out = int((~drop).sum())
        reasons = np.where(exact_dup, 1, np.where(drop, 2, 0))
        want = {1: "exact_duplicate", 2: "near_duplicate"}
        for code, reason in want.items():
            stats.dropped[reason] = int((reasons == code).sum())
        example_pos = sorted(int(p) for code in want for p in np.flatnonzero(reasons == code)[:3])
        needed = {int(p) for p in example_pos} | {int(roots[p]) for p in example_pos}
        ids = work.documents_at(offsets, needed)
        for p in example_pos:
            stats.add_example(want[int(reasons[p])], f"[{ids[p][0]} duplicates {ids[int(roots[p])][0]}] {ids[p][1]}")
        for i in range(len(offsets) - 1):
            lens = work.text_lengths(i)
            stats.characters_in += int(lens.sum())
            stats.characters_out += int(lens[~drop[offsets[i]:offsets[i + 1]]].sum())
        return stats
