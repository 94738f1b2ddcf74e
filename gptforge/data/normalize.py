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

import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

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
        text = normalize_text(doc["text"], form)
        if not text.strip():
            stats.drop("empty")
            continue
        stats.documents_out += 1
        stats.characters_out += len(text)
        yield {**doc, "text": text}
