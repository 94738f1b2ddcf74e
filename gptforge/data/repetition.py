"""Gopher's repetition filter: documents made of repeated lines, paragraphs or n-grams.

Source: Rae et al. 2021, "Scaling Language Models: Methods, Analysis & Insights from Training
Gopher", Appendix A.1.1 and Table A1 (the thresholds). A family of `gptforge.data.filters`
(the `RuleFilter` base and its conventions), in a module of its own with its n-gram statistics
(`NgramStats`).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from gptforge.data.filters import RuleFilter, duplicates
from gptforge.data.text_stats import is_cjk, mix64, words


def top_ngram_char_fraction(ws: list[str], n: int) -> float:
    """Characters of the most frequent word n-gram times its count, over all word characters.

    Gopher (Table A1) measures how much of a document one repeated phrase covers. An n-gram
    seen once does not count. Among equally frequent n-grams the first one seen counts.
    """
    return NgramStats(ws).top_fraction(n)


def duplicate_ngram_char_fraction(ws: list[str], n: int) -> float:
    """Fraction of word characters inside word n-grams that occur more than once.

    Overlapping duplicates count each character once (Gopher, Appendix A.1.1).
    """
    return NgramStats(ws).duplicate_fraction(n)


class NgramStats:
    """Word n-gram statistics of one document, vectorized with numpy.

    Words become integer ids (equal words, equal ids); the n-gram at position i is a 64-bit
    hash chained over ids[i:i+n] (computed for n = 1, 2, ... incrementally), so one sort per n
    finds the repeated n-grams. Two different n-grams share a key with probability ~2**-64 per
    pair, far below anything that could move a threshold.
    """

    def __init__(self, ws: list[str]):
        vocab: dict[str, int] = {}
        ids = np.fromiter((vocab.setdefault(w, len(vocab)) for w in ws), dtype=np.uint64, count=len(ws))
        self.n_words = len(ws)
        self.lengths = np.fromiter(map(len, ws), dtype=np.int64, count=len(ws))
        self.cum = np.concatenate([[0], np.cumsum(self.lengths)])
        self.total = int(self.cum[-1])
        self._ids = mix64(ids + np.uint64(1))
        self._keys = {1: self._ids}

    def keys(self, n: int) -> np.ndarray:
        """(n_words - n + 1,) uint64 key of the n-gram starting at each position."""
        if n not in self._keys:
            prev = self.keys(n - 1)
            with np.errstate(over="ignore"):
                self._keys[n] = mix64(prev[:-1] * np.uint64(0x9E3779B97F4A7C15) + self._ids[n - 1:])
        return self._keys[n]

    def top_fraction(self, n: int) -> float:
        """As `top_ngram_char_fraction`."""
        if self.n_words < n or not self.total:
            return 0.0
        _, first, counts = np.unique(self.keys(n), return_index=True, return_counts=True)
        best = int(counts.max())
        if best <= 1:
            return 0.0
        i = int(first[counts == best].min())
        return min(1.0, int(self.cum[i + n] - self.cum[i]) * best / self.total)

    def duplicate_fraction(self, n: int) -> float:
        """As `duplicate_ngram_char_fraction`."""
        if self.n_words < n or not self.total:
            return 0.0
        _, inverse, counts = np.unique(self.keys(n), return_inverse=True, return_counts=True)
        starts = np.flatnonzero(counts[inverse] > 1)
        if not len(starts):
            return 0.0
        # Every occurrence of a repeated n-gram covers its n words: mark [start, start + n).
        delta = np.zeros(self.n_words + 1, dtype=np.int64)
        np.add.at(delta, starts, 1)
        np.add.at(delta, starts + n, -1)
        covered = np.cumsum(delta[:-1]) > 0
        return int(self.lengths[covered].sum()) / self.total


@dataclass
class GopherRepetition(RuleFilter):
    """Gopher's repetition rules (Rae et al. 2021, Table A1).

    Drop when duplicate lines are more than 30% of lines or 20% of characters; duplicate
    paragraphs (separated by blank lines) more than 30% / 20%; the most frequent word 2-, 3-,
    4-gram covers more than 20%, 18%, 16% of the word characters; or the duplicated word 5- to
    10-grams cover more than 15%, 14%, 13%, 12%, 11%, 10%.
    """

    max_dup_line_fraction: float = 0.30
    max_dup_para_fraction: float = 0.30
    max_dup_line_char_fraction: float = 0.20
    max_dup_para_char_fraction: float = 0.20
    top_ngram_max: dict[int, float] = field(default_factory=lambda: {2: 0.20, 3: 0.18, 4: 0.16})
    dup_ngram_max: dict[int, float] = field(default_factory=lambda: {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12,
                                                                     9: 0.11, 10: 0.10})
    #: CJK words are single characters here, and a Chinese word is about two characters long,
    #: so n-gram windows are round(n * this) characters in CJK-dominant documents (else common
    #: multi-character words repeated twice would read as duplicated 5-grams). The Chinese
    #: language table sets 1.75 (bench/zh_word_units.py: closest to jieba-word n-grams).
    cjk_ngram_scale: float = 2
    language: str = "en"
    name: str = "gopher_repetition"
    counts: Counter = field(default_factory=Counter, repr=False)

    def check(self, text: str) -> str | None:
        """The first rule `text` breaks, or None."""
        total = len(text) or 1
        paras = [p for p in re.split(r"\n{2,}", text.strip()) if p.strip()]
        if paras:
            count, chars = duplicates(paras)
            if count / len(paras) > self.max_dup_para_fraction:
                return "dup_para_fraction"
            if chars / total > self.max_dup_para_char_fraction:
                return "dup_para_char_fraction"
        lines = [ln for ln in text.split("\n") if ln.strip()]
        if lines:
            count, chars = duplicates(lines)
            if count / len(lines) > self.max_dup_line_fraction:
                return "dup_line_fraction"
            if chars / total > self.max_dup_line_char_fraction:
                return "dup_line_char_fraction"
        grams = NgramStats(words(text))
        scale = self.cjk_ngram_scale if is_cjk(text) else 1
        for n, limit in sorted(self.top_ngram_max.items()):
            if grams.top_fraction(round(int(n) * scale)) > limit:
                return f"top_{n}gram"
        for n, limit in sorted(self.dup_ngram_max.items()):
            if grams.duplicate_fraction(round(int(n) * scale)) > limit:
                return f"dup_{n}gram"
        return None
