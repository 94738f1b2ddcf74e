""".txt / .md and other plain-text files: one document per file, or split at a separator."""

from __future__ import annotations

import codecs
import logging
from collections.abc import Iterator
from pathlib import Path

from gptforge.data.readers.base import _REPLACE, Document, ReadStats, _sniff_stream, decode_utf8
from gptforge.data.readers.files import open_binary

log = logging.getLogger("gptforge.data")


def _read_text(path: Path, stats: ReadStats, doc_separator: str | None = None, opener=None) -> Iterator[Document]:
    if doc_separator:
        yield from _read_text_separated(path, stats, doc_separator, opener)
        return
    with (opener() if opener else open_binary(path)) as fh:
        head = _sniff_stream(fh, path)
        data = head + fh.read()
    text, bad = decode_utf8(data)
    if bad:
        stats.undecodable_sequences += bad
        stats.documents_with_undecodable += 1
    stats.documents += 1
    yield {"id": str(path), "text": text, "meta": {"source": str(path)}}


def _read_text_separated(path: Path, stats: ReadStats, separator: str, opener=None) -> Iterator[Document]:
    """Documents of a text file cut at `separator` (streamed: the file is never held whole).

    Ids are `PATH@N`, N the 0-based piece number counting empty pieces too, so an id does not
    change when another piece becomes empty.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors=_REPLACE.name)
    with (opener() if opener else open_binary(path)) as fh:
        chunk = _sniff_stream(fh, path)
        rest = ""
        piece = 0
        while True:
            before = _REPLACE.count
            final = not chunk
            rest += decoder.decode(chunk, final=final)
            bad = _REPLACE.count - before
            if bad:  # attributed to the piece being read; close enough for a count
                stats.undecodable_sequences += bad
                stats.documents_with_undecodable += 1
            parts = rest.split(separator)
            rest = parts.pop() if not final else ""
            for text in parts:
                if text.strip():
                    stats.documents += 1
                    yield {"id": f"{path}@{piece}", "text": text, "meta": {"source": str(path)}}
                piece += 1
            if final:
                break
            chunk = fh.read(4 << 20)
