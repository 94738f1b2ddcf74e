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

import os
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Literal, cast

from gptforge.data.readers import Document

_Form = Literal["NFC", "NFD", "NFKC", "NFKD"]  # the forms `clean` accepts (checked where it is built)


def normalize_text(text: str, form: str = "NFC") -> str:
    """Return `text` with a leading BOM removed, CRLF/CR turned into LF and Unicode `form` applied."""
    if text.startswith("\ufeff"):
        text = text[1:]
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if form and not unicodedata.is_normalized(cast(_Form, form), text):
        text = unicodedata.normalize(cast(_Form, form), text)
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
    - `width`: full-width digits, Latin letters and @ . - _ become ASCII (`fold_width`), all
      other full-width and CJK punctuation keeps its width; counts `width_changed` (documents)
      and `width_characters`. Off by default.
    - `opencc`: Traditional <-> Simplified Chinese through OpenCC's bundled configuration of
      that name (`OPENCC_CONFIGS`: t2s, s2t, tw2sp, s2twp, hk2s; `convert_chinese`); counts
      `opencc_changed` (documents) and `opencc_characters`. None (default): no conversion.

    Raises:
        ValueError: an unknown `form` or `opencc` configuration.
        ImportError: `fix_mojibake` without the `ftfy` package (pip install ftfy), `opencc`
            without the `opencc` package.
    """

    fix_mojibake: bool = True
    control_chars: bool = True
    whitespace: bool = False
    form: str | None = None
    width: bool = False
    opencc: str | None = None
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
        self._opencc = opencc_converter(self.opencc) if self.opencc else None

    def __getstate__(self) -> dict:
        # ftfy (a module) and the OpenCC converter (a C++ object) do not pickle: rebuilt on load.
        return {k: v for k, v in self.__dict__.items() if k not in ("_ftfy", "_opencc")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__post_init__()

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
        if self.form and not unicodedata.is_normalized(cast(_Form, self.form), text):
            self.counts[f"{self.form}_changed"] += 1
            text = unicodedata.normalize(cast(_Form, self.form), text)
        if self.width:
            text, n = fold_width(text)
            if n:
                self.counts["width_changed"] += 1
                self.counts["width_characters"] += n
        if self._opencc is not None:
            text, n = convert_chinese(text, self._opencc)
            if n:
                self.counts["opencc_changed"] += 1
                self.counts["opencc_characters"] += n
        return text

    def __call__(self, doc: Document) -> Document | str:
        text = self.clean(doc.text)
        if text is doc.text:
            return doc
        if not text.strip():
            return "empty_after_clean"
        return replace(doc, text=text)


# --------------------------------------------------------------------------------------------
# Chinese: character width and Traditional <-> Simplified script
# --------------------------------------------------------------------------------------------

#: full-width digits (U+FF10-FF19), Latin capitals (U+FF21-FF3A) and small letters
#: (U+FF41-FF5A), and full-width @ . - _, to their ASCII forms. Every other full-width form
#: (，。！？：；（）「」 ...) is Chinese punctuation and keeps its width.
WIDTH_MAP = {**{0xFF10 + i: 0x30 + i for i in range(10)}, **{0xFF21 + i: 0x41 + i for i in range(26)},
             **{0xFF41 + i: 0x61 + i for i in range(26)}, **{ord(f): ord(h) for f, h in zip("＠．－＿", "@.-_", strict=True)}}
_WIDE = re.compile("[\uff10-\uff19\uff21-\uff3a\uff41-\uff5a＠．－＿]")


def fold_width(text: str) -> tuple[str, int]:
    """(`text` with the characters of `WIDTH_MAP` made half-width, how many were changed).

    "ＧＰＴ－４，共１２８ｋ。" -> ("GPT-4，共128k。", 9): the comma and full stop stay full-width.
    The same object comes back when nothing changed.
    """
    n = len(_WIDE.findall(text))
    return (text.translate(WIDTH_MAP), n) if n else (text, 0)


#: OpenCC's bundled configurations that `Clean(opencc=...)` accepts.
OPENCC_CONFIGS = {"t2s": "Traditional to Simplified", "s2t": "Simplified to Traditional",
                  "tw2sp": "Traditional (Taiwan) to Simplified, with Mainland phrases",
                  "s2twp": "Simplified to Traditional (Taiwan), with Taiwanese phrases",
                  "hk2s": "Traditional (Hong Kong) to Simplified"}


def opencc_converter(config: str):
    """An `opencc.OpenCC` converter for one of `OPENCC_CONFIGS` (BYVoid's OpenCC, PyPI `opencc`).

    Raises:
        ValueError: `config` is not one of `OPENCC_CONFIGS`.
        ImportError: the `opencc` package is missing, or the module of that name is
            `opencc-python-reimplemented` (same import name, other configurations and results).
    """
    if config not in OPENCC_CONFIGS:
        raise ValueError(f"clean: opencc must be one of {', '.join(OPENCC_CONFIGS)}, got {config!r}")
    try:
        import opencc
    except ImportError:
        raise ImportError("the clean step's opencc option needs OpenCC: pip install opencc "
                          "(or pip install 'gptforge[zh]')") from None
    if not hasattr(opencc, "clib"):  # OpenCC's own binding ships its C++ library as opencc.clib
        raise ImportError("the installed 'opencc' module is not OpenCC's own package (opencc-python-reimplemented?): "
                          "pip uninstall opencc-python-reimplemented && pip install opencc")
    return opencc.OpenCC(config)


def changed_characters(before: str, after: str) -> int:
    """Characters a conversion changed: position by position when the lengths are equal, else
    the longer of the two stretches between the common prefix and the common suffix (an upper
    bound; OpenCC's phrase conversions such as 內存 -> 記憶體 change the length)."""
    if len(before) == len(after):
        return sum(a != b for a, b in zip(before, after, strict=True))
    p = len(os.path.commonprefix([before, after]))
    s = len(os.path.commonprefix([before[p:][::-1], after[p:][::-1]]))
    return max(len(before), len(after)) - p - s


def convert_chinese(text: str, converter) -> tuple[str, int]:
    """(`text` converted by an `opencc_converter`, `changed_characters` of the conversion).

    Line by line, so that the count stays local to the lines that changed. Only lines holding
    a Han character are handed to OpenCC; the same object comes back when nothing changed.
    """
    if not _HAN.search(text):
        return text, 0
    lines = text.split("\n")
    n = 0
    for i, line in enumerate(lines):
        if _HAN.search(line):
            new = converter.convert(line)
            if new != line:
                n += changed_characters(line, new)
                lines[i] = new
    return ("\n".join(lines), n) if n else (text, 0)


_HAN = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff]")


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
