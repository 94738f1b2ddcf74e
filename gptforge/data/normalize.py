"""Normalization applied to every document before anything else sees it.

- a leading UTF-8 byte-order mark (U+FEFF) is removed: it is an encoding artefact, not text;
- line ends become LF: CRLF and lone CR (old Mac files) -> "\\n", so the same text from
  Windows and Unix tokenizes identically;
- Unicode NFC (canonical composition, UAX #15): "e" + combining acute and the precomposed "é"
  become the same code points, hence the same tokens. NFC, not NFKC, because NFKC rewrites
  meaningful characters (full-width forms, superscripts, ligatures).

Documents empty (or only whitespace) after normalization are dropped and counted.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

from gptforge.data.readers import Document


def normalize_text(text: str, form: str = "NFC") -> str:
    """Return `text` with a leading BOM removed, CRLF/CR turned into LF and Unicode `form` applied."""
    if text.startswith("\ufeff"):
        text = text[1:]
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if form and not unicodedata.is_normalized(form, text):
        text = unicodedata.normalize(form, text)
    return text


@dataclass
class NormalizeStats:
    """What normalization dropped and changed."""

    documents_in: int = 0
    documents_out: int = 0
    characters_out: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> documents

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def merge(self, other: NormalizeStats) -> None:
        self.documents_in += other.documents_in
        self.documents_out += other.documents_out
        self.characters_out += other.characters_out
        for k, v in other.dropped.items():
            self.dropped[k] = self.dropped.get(k, 0) + v


def normalize_documents(docs: Iterable[Document], stats: NormalizeStats | None = None,
                        form: str = "NFC") -> Iterator[Document]:
    """Normalize each document's text (see `normalize_text`); drop and count empty ones."""
    stats = stats if stats is not None else NormalizeStats()
    for doc in docs:
        stats.documents_in += 1
        text = normalize_text(doc.text, form)
        if not text.strip():
            stats.drop("empty")
            continue
        stats.documents_out += 1
        stats.characters_out += len(text)
        yield replace(doc, text=text)


# --------------------------------------------------------------------------------------------
# The `clean` recipe step: mojibake repair, control characters, whitespace runs
# --------------------------------------------------------------------------------------------

#: C0 controls except TAB and LF (CR is gone after normalize_text), DEL, C1 controls, and the
#: zero-width / direction-override format characters that render as nothing but split tokens.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b\u200e\u200f\u202a-\u202e\u2060\ufeff]")
#: whitespace at a line end, and 3+ line breaks (2+ blank lines) in a row.
_TRAILING_WS = re.compile(r"[ \t\u00a0]+$", re.MULTILINE)
_BLANK_RUN = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)+")
#: characters that mojibake (UTF-8 read as Latin-1/cp1252) almost always leaves behind: a lead
#: byte of a 2/3-byte sequence shown as Ã Â â Ä Å Æ Ð Ñ ... followed by a cp1252/Latin-1
#: continuation glyph. Only texts matching this are handed to ftfy's own (slower) badness test.
_MOJIBAKE_HINT = re.compile("[\u00c2-\u00f4][\u0080-\u00bf\u0152\u0153\u0160\u0161\u0178\u017d\u017e\u0192\u02c6\u02dc\u2013-\u203a\u20ac\u2122]")


@dataclass
class Clean:
    """Repair and tidy a document's text; never drops a document (empty results aside).

    - `fix_mojibake`: text garbled by a wrong decode ("doesnâ€™t") is repaired with ftfy
      (Speer 2019, `ftfy.fix_text`). ftfy runs at a few MB/s, so it is only called on
      documents that are not pure ASCII, match a cheap regex for mojibake byte pairs, and that
      ftfy's own `badness.is_bad` then confirms; `counts["mojibake_fixed"]` counts repairs.
    - `control_chars`: C0/C1 control characters (TAB and LF kept) and invisible format
      characters (zero-width space, direction overrides, stray BOMs) are removed.
    - `whitespace`: trailing spaces at line ends are removed and runs of blank lines become
      one blank line. Indentation and spaces inside lines are kept (source code needs them).
    - `form`: "NFKC" applies compatibility normalization on top of the reader's NFC
      (full-width letters, ligatures and superscripts become plain forms); None keeps NFC.

    Raises:
        ValueError: an unknown `form`.
        ImportError: `fix_mojibake` without the `ftfy` package (pip install ftfy).
    """

    fix_mojibake: bool = True
    control_chars: bool = True
    whitespace: bool = False
    form: str | None = None
    name: str = "clean"
    counts: Counter = field(default_factory=Counter, repr=False)

    def __post_init__(self) -> None:
        if self.form not in (None, "NFC", "NFKC", "NFD", "NFKD"):
            raise ValueError(f"clean: form must be NFC, NFKC, NFD, NFKD or null, got {self.form!r}")
        self._ftfy = None
        if self.fix_mojibake:
            try:
                import ftfy
            except ImportError as e:
                raise ImportError("the clean step's fix_mojibake needs ftfy: pip install ftfy "
                                  "(or set fix_mojibake: false in the recipe)") from e
            self._ftfy = ftfy

    def clean(self, text: str) -> str:
        """The cleaned text (see the class docstring)."""
        if self._ftfy is not None and not text.isascii() and _MOJIBAKE_HINT.search(text):
            self.counts["mojibake_checked"] += 1
            if self._ftfy.badness.is_bad(text):
                fixed = self._ftfy.fix_text(text, normalization="NFC", uncurl_quotes=False)
                if fixed != text:
                    self.counts["mojibake_fixed"] += 1
                    text = fixed
        if self.control_chars and _CONTROL.search(text):
            self.counts["control_chars_removed"] += 1
            text = _CONTROL.sub("", text)
        if self.whitespace:
            new = _BLANK_RUN.sub("\n\n", _TRAILING_WS.sub("", text))
            if new != text:
                self.counts["whitespace_changed"] += 1
                text = new
        if self.form and not unicodedata.is_normalized(self.form, text):
            self.counts[f"{self.form}_changed"] += 1
            text = unicodedata.normalize(self.form, text)
        return text

    def __call__(self, doc: Document) -> Document | str:
        text = self.clean(doc.text)
        if text is doc.text:
            return doc
        if not text.strip():
            return "empty_after_clean"
        return replace(doc, text=text)


def prepared_normalization(meta: dict | None) -> str | None:
    """The Unicode form prepare applied to a shard folder's documents, from its meta.json dict:
    the recipe's `normalization` (recorded in `prepare_config.recipe_steps`; NFC when the recipe
    leaves it out, as `pipeline.build_recipe` does), "" for a recipe with normalization none, or
    None when `meta` records no recipe (then only the BOM / line-end part is known to apply)."""
    recipe = ((meta or {}).get("prepare_config") or {}).get("recipe_steps")
    if not isinstance(recipe, dict):
        return None
    form = recipe.get("normalization", "NFC")
    return "" if form in (None, "none", False) else str(form)
