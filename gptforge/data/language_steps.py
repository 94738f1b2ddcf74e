"""Recipe steps that apply each document's own language's thresholds (`gptforge.data.languages`).

The Gopher, C4 and FineWeb filters (`LANGUAGE_STEPS`) count words, sentences, lines, terminal
punctuation and stop words, and what counts as each differs between languages. In a recipe each
of them becomes a `PerLanguage` step: one instance of the filter per language seen, built from
that language's table (`LanguageParams.step_options`) with the recipe's own options for the step
on top (an option written in the recipe applies to every language). A document's language is
the label of the langid step (`Document.language`) when a table exists for it, else the recipe's
top-level `language` (English by default). With English documents and the English table (the
filters' published defaults) a step decides exactly as the filter alone.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gptforge.data.filters import C4Quality, FineWebQuality, GopherQuality, GopherRepetition
from gptforge.data.languages import ALIASES, LANGUAGES, load_language
from gptforge.data.readers import Document

#: recipe step name -> filter whose thresholds come from the language tables.
LANGUAGE_STEPS: dict[str, type] = {"c4": C4Quality, "gopher_quality": GopherQuality,
                                   "gopher_repetition": GopherRepetition, "fineweb": FineWebQuality}
_TUPLES = ("stop_words",)


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


@dataclass
class PerLanguage:
    """A `DocumentStep` running filter `step` (a name of `LANGUAGE_STEPS`) with each document's
    language's options (`options_in_force`), one filter instance per language.

    `counts` gathers the filters' own counts, plus "removed LANG" per document dropped, so the
    report gives removals per language; `line_examples` gathers C4's removed-line examples.

    Raises:
        ValueError: (at construction) `step` is no language-aware step, or `default_language`
            has no table.
    """

    step: str
    options: dict[str, Any] = field(default_factory=dict)
    default_language: str = "en"
    counts: Counter = field(default_factory=Counter, repr=False)
    line_examples: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.step not in LANGUAGE_STEPS:
            raise ValueError(f"{self.step!r} is not a language-aware step ({', '.join(LANGUAGE_STEPS)})")
        self.default_language = load_language(self.default_language).code
        self.options = dict(self.options)
        self._filters: dict[str, Any] = {}
        self.filter_for(self.default_language)  # bad options fail now, not in a worker

    @property
    def name(self) -> str:
        return self.step

    def filter_for(self, language: str) -> Any:
        """The filter instance for table `language` (made on first use)."""
        f = self._filters.get(language)
        if f is None:
            f = self._filters[language] = LANGUAGE_STEPS[self.step](**options_in_force(self.step, self.options,
                                                                                        language))
        return f

    def __call__(self, doc: Document) -> Document | str:
        lang = table_language(doc.language, self.default_language)
        f = self.filter_for(lang)
        out = f(doc)
        if f.counts:
            self.counts.update(f.counts)
            f.counts.clear()
        examples = getattr(f, "line_examples", None)
        if examples:
            for reason, lines in examples.items():
                mine = self.line_examples.setdefault(reason, [])
                mine.extend(lines[:max(0, 3 - len(mine))])
            examples.clear()
        if isinstance(out, str):
            self.counts[f"removed {lang}"] += 1
        return out
