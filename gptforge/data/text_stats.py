"""Language-aware word splitting shared by the quality filters and near-duplicate detection.

Chinese and Japanese are written without spaces, so a whitespace split would see a whole CJK
paragraph as one "word" and word-count filters would drop all such text. Here each Han
ideograph and each kana counts as one word (a character is the closest unit to a word that needs
no dictionary), while Latin, Cyrillic, Greek, Hangul (spaced) and other scripts split on spaces
and punctuation.
"""

from __future__ import annotations

import re

import numpy as np

# Han (CJK unified ideographs and extensions A, compatibility), hiragana, katakana.
CJK_CLASS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff"
_CJK_CHAR = re.compile(f"[{CJK_CLASS}]")
#: a word: one CJK character, or a run of word characters (letters, digits, underscore, marks)
#: possibly joined by apostrophes or hyphens ("don't", "state-of-the-art").
#: `[^\\W...]` is "a word character that is not CJK" as one class (no per-character lookahead: ~3x faster).
_WORD = re.compile(f"[{CJK_CLASS}]|[^\\W{CJK_CLASS}]+(?:['’\\-][^\\W{CJK_CLASS}]+)*")
#: non-space tokens, as Gopher counts symbols and words (whitespace split; CJK per character).
_TOKEN = re.compile(f"[{CJK_CLASS}]|[^\\s{CJK_CLASS}]+")


_last_words: tuple[str, list[str]] = ("", [])


def words(text: str) -> list[str]:
    """Words of `text` without punctuation; CJK characters are one word each.

    The last result is remembered: consecutive filters usually ask for the words of the same
    text (identity checked, so a reused string id can never return stale words). Callers must
    not modify the returned list.
    """
    global _last_words
    last_text, last = _last_words
    if last_text is text:
        return last
    ws = _WORD.findall(text)
    _last_words = (text, ws)
    return ws


def tokens(text: str) -> list[str]:
    """Whitespace-separated tokens (punctuation kept attached); CJK characters one each."""
    return _TOKEN.findall(text)


def cjk_fraction(text: str) -> float:
    """Fraction of the non-space characters that are Han ideographs or kana."""
    nonspace = len(text) - sum(text.count(c) for c in " \n\t\r")
    if nonspace <= 0:
        return 0.0
    return len(_CJK_CHAR.findall(text)) / nonspace


def is_cjk(text: str, threshold: float = 0.3) -> bool:
    """True when at least `threshold` of the non-space characters are CJK."""
    return cjk_fraction(text) >= threshold


def mix64(h: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer (Steele et al. 2014), elementwise on uint64 (wrapping)."""
    with np.errstate(over="ignore"):
        h = h ^ (h >> np.uint64(30))
        h = h * np.uint64(0xBF58476D1CE4E5B9)
        h = h ^ (h >> np.uint64(27))
        h = h * np.uint64(0x94D049BB133111EB)
        return h ^ (h >> np.uint64(31))
