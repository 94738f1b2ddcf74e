"""Per-language parameters of the quality filters, kept as data: one YAML table per language.

Each table (`en.yaml`, `zh.yaml`, `ja.yaml`, `ko.yaml` beside this module) holds a language's
sentence ends, terminal punctuation, stop words, word unit and the thresholds of the Gopher,
C4 and FineWeb steps, as the option names of those steps (`gptforge.data.filters`). English
holds the published defaults the filters have always used. Chinese, Japanese and Korean start
from FineWeb 2's per-language configurations (Penedo et al. 2025, arXiv 2506.20920;
`configs/{iso3}_{script}.yml` in huggingface/fineweb-2), which were measured on words of a
per-language word tokenizer (jieba for Chinese in datatrove).

Word unit for Chinese and Japanese: characters, with the thresholds recalibrated, not jieba.
The evidence (bench/zh_word_units.py, figures in bench/RESULTS.md): jieba segments about
0.2 MB/s on one core, 20-50x slower than the character split, so it would set prepare's speed
on Chinese; on the same text, the word n-gram repetition fractions Gopher thresholds on are
close to the character fractions with windows of round(1.75 n) characters (98% of test documents
get the same keep/drop decision at FineWeb 2's thresholds; jieba's mean word is 1.65 characters),
and FineWeb 2's Chinese stop words are all single characters. The tables say
per threshold how it was carried over.

Sentences: in Chinese and Japanese a sentence end (。！？；…) is followed by the next sentence
with no space, so `count_sentences` counts those ends anywhere, and only the ASCII full stop
still needs a space or the text's end after it (so "3.14" is no sentence end).
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

LANGUAGES = ("en", "zh", "ja", "ko")
_TUPLES = ("stop_words",)
#: other spellings of the same languages: ISO 639-3 codes, FineWeb 2 names, regional tags.
ALIASES = {"eng": "en", "eng_latn": "en", "zho": "zh", "cmn": "zh", "cmn_hani": "zh", "zh-cn": "zh", "zh-tw": "zh",
           "zh-hans": "zh", "zh-hant": "zh", "zh-hk": "zh", "jpn": "ja", "jpn_jpan": "ja", "kor": "ko",
           "kor_hang": "ko"}
TABLE_KEYS = ("name", "fineweb2", "words", "ngram_scale", "sentence_ends", "terminal_punctuation", "stop_words",
              "steps")
_DIR = Path(__file__).parent


@dataclass(frozen=True)
class LanguageParams:
    """One language's table (see the module docstring).

    Attributes:
        code: "en", "zh", "ja" or "ko".
        words: "whitespace" (letters and digits between spaces and punctuation) or "character"
            (each Han character or kana is a word), as `text_stats.words` splits them.
        ngram_scale: characters per word of an n-gram window (1.75 for Chinese and Japanese characters).
        no_space_ends: characters that end a sentence wherever they stand.
        before_space_ends: characters that end a sentence only before whitespace or the end.
        terminal_punctuation: what a line (C4) or a "punctuated line" (FineWeb) ends with.
        steps: step name -> {option: value} for the steps' dataclass fields.
    """

    code: str
    name: str
    fineweb2: str | None
    words: str
    ngram_scale: float
    no_space_ends: str
    before_space_ends: str
    terminal_punctuation: tuple[str, ...]
    stop_words: tuple[str, ...]
    steps: dict[str, dict[str, Any]]

    @functools.cached_property
    def sentence_end(self) -> re.Pattern:
        """The regex of one sentence end: a run of `no_space_ends`, or a run of
        `before_space_ends` followed by whitespace or the end of the text."""
        parts = []
        if self.no_space_ends:
            parts.append(f"[{re.escape(self.no_space_ends)}]+")
        if self.before_space_ends:
            parts.append(f"[{re.escape(self.before_space_ends)}]+(?:\\s|$)")
        return re.compile("|".join(parts))

    def step_options(self, step: str) -> dict[str, Any]:
        """The options of recipe step `step` (e.g. "c4") for this language; {} for none."""
        opts = dict(self.steps.get(step, {}))
        if step == "gopher_quality":
            opts.setdefault("stop_words", self.stop_words)
        if step == "gopher_repetition" and self.words == "character":
            opts.setdefault("cjk_ngram_scale", self.ngram_scale)
        return opts


def canonical(code: str) -> str:
    """The table name of a language code ("zh-TW", "cmn_Hani", "zho" -> "zh").

    Raises:
        ValueError: a language without a table; the message lists the known ones.
    """
    low = str(code).strip().lower()
    low = ALIASES.get(low, low)
    if low not in LANGUAGES:
        close = difflib.get_close_matches(low, list(LANGUAGES) + list(ALIASES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"no language table for {code!r}{hint}; known: {', '.join(LANGUAGES)}")
    return low


@functools.lru_cache(maxsize=None)
def load_language(code: str) -> LanguageParams:
    """The parameters of language `code` (any spelling `canonical` knows), read from its YAML.

    Raises:
        ValueError: an unknown language, or a table with a missing or unknown key (names the file).
    """
    code = canonical(code)
    path = _DIR / f"{code}.yaml"
    table = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(table, dict) or set(table) != set(TABLE_KEYS):
        got = sorted(table) if isinstance(table, dict) else type(table).__name__
        raise ValueError(f"{path.name}: a language table has exactly the keys {', '.join(TABLE_KEYS)}; got {got}")
    if table["words"] not in ("whitespace", "character"):
        raise ValueError(f"{path.name}: words must be 'whitespace' or 'character', got {table['words']!r}")
    ends = table["sentence_ends"] or {}
    return LanguageParams(code=code, name=table["name"], fineweb2=table["fineweb2"], words=table["words"],
                          ngram_scale=float(table["ngram_scale"]), no_space_ends=str(ends.get("no_space") or ""),
                          before_space_ends=str(ends.get("before_space") or ""),
                          terminal_punctuation=tuple(table["terminal_punctuation"]),
                          stop_words=tuple(str(w) for w in table["stop_words"]), steps=dict(table["steps"] or {}))


def table_language(label: str | None, default: str) -> str:
    """The language table for a document labelled `label` ("zh", "zh-TW", "cmn_Hani" -> "zh"):
    `default` when the label is None or names a language without a table (e.g. "fr")."""
    if not label:
        return default
    low = str(label).strip().lower()
    low = ALIASES.get(low, low)
    return low if low in LANGUAGES else default


def options_in_force(step: str, options: dict[str, Any], language: str) -> dict[str, Any]:
    """The options recipe step `step` runs with on `language`'s documents: the language table's,
    with the recipe's `options` on top, and `language` itself."""
    merged = {**load_language(language).step_options(step), **options, "language": language}
    return {k: tuple(v) if k in _TUPLES and isinstance(v, list) else v for k, v in merged.items()}


def count_sentences(text: str, language: str | LanguageParams = "en") -> int:
    """Sentence ends in `text` by `language`'s rule (`LanguageParams.sentence_end`).

    English: "One. Two! Three?" -> 3, "pi is 3.14" -> 0. Chinese: "第一句。第二句！第三句？" -> 3
    (no space after a Chinese sentence end), "价格3.5元。" -> 1, "……" -> 1 (one run).
    """
    params = language if isinstance(language, LanguageParams) else load_language(language)
    return len(params.sentence_end.findall(text))


def ends_with_terminal(line: str, language: str | LanguageParams = "en") -> bool:
    """Whether `line` (trailing whitespace ignored) ends with `language`'s terminal punctuation."""
    params = language if isinstance(language, LanguageParams) else load_language(language)
    return line.rstrip().endswith(params.terminal_punctuation)


def terminal_line_fraction(lines: list[str], language: str | LanguageParams = "en") -> float:
    """Share of the non-empty `lines` that end with terminal punctuation (0.0 for none), the
    quantity of FineWeb's `min_punct_line_ratio`."""
    params = language if isinstance(language, LanguageParams) else load_language(language)
    kept = [ln for ln in lines if ln.strip()]
    return sum(ends_with_terminal(ln, params) for ln in kept) / len(kept) if kept else 0.0


def count_stop_words(text: str, language: str | LanguageParams = "en", at_most: int | None = None) -> int:
    """Occurrences of `language`'s stop words among the words of `text` (`text_stats.words`:
    characters for Chinese and Japanese, lower-cased whitespace words otherwise), stopping at
    `at_most` when given (Gopher only asks whether there are at least `min_stop_words`).

    English: "the cat and the hat" -> 3; Chinese: "我的书在桌子上" -> 2 (的, 在).
    """
    from gptforge.data.text_stats import words

    params = language if isinstance(language, LanguageParams) else load_language(language)
    stop = frozenset(params.stop_words)
    found = 0
    for w in words(text):
        if (w if params.words == "character" else w.lower()) in stop:
            found += 1
            if at_most is not None and found >= at_most:
                break
    return found
