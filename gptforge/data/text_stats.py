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


def whitespace_pieces(text: str, max_chars: int):
    """`text` in consecutive pieces of at most `max_chars` characters, cut where whitespace starts.

    Each cut is at the first character of a run of spaces/newlines whose previous character is
    not whitespace, so the later piece starts with the whole run. Byte-level BPE (GPT-2's
    pre-tokenization regex) and the dedup word split never join characters across such a
    point, so tokenizing or shingling the pieces one by one gives what the whole text gives
    (tests check both). A stretch with no such point within `max_chars` is cut at a hard
    limit of 4 * `max_chars` characters (there the results may differ at the cut).
    Joined, the pieces are `text`. Yields str.
    """
    n = len(text)
    start = 0
    while n - start > max_chars:
        hi = start + max_chars
        cut = -1
        lo = start + 1
        while cut < 0:
            i = max(text.rfind(" ", lo, hi), text.rfind("\n", lo, hi))
            if i < lo:
                break
            while i > start and text[i - 1] in " \n\t\r":  # back to the start of the run
                i -= 1
            if i > start:
                cut = i
            else:
                break
        if cut < 0:  # no whitespace in the window: look further, up to the hard limit
            far = min(n, start + 4 * max_chars)
            j = min((k for k in (text.find(" ", hi, far), text.find("\n", hi, far)) if k >= 0), default=-1)
            cut = j if j > start and text[j - 1] not in " \n\t\r" else far
        yield text[start:cut]
        start = cut
    if start < n or not n:
        yield text[start:]
