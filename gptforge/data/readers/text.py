""".txt / .md and other plain-text files: one document per file, or split at a separator."""

from __future__ import annotations

import codecs
import io
import logging
from collections.abc import Iterator
from pathlib import Path

import gptforge.data.readers.base as base
from gptforge.data.readers.base import Document, Opener, Reader, ReadOptions, ReadStats
from gptforge.data.readers.files import open_binary

log = logging.getLogger("gptforge.data")


class TextReader(Reader):
    """One document per file (id: the path), or one per piece between separators (`PATH@N`).

    Also the reader of files whose name has no known extension and whose bytes no reader claims."""

    extensions = frozenset(base.TEXT_EXTS)

    def read(self, path: Path, stats: ReadStats, options: ReadOptions, opener: Opener | None = None) -> Iterator[Document]:
        if options.doc_separator:
            yield from read_text_separated(path, stats, options.doc_separator, opener)
            return
        with (opener() if opener else open_binary(path)) as fh:
            head = base.sniff_stream(fh, path)
            data = head + fh.read()
        text, bad = base.decode_utf8(data)
        stats.count_undecodable(bad)
        stats.documents += 1
        yield Document(text, str(path), str(path))


def read_text_separated(path: Path, stats: ReadStats, separator: str, opener: Opener | None = None,
                        first_piece: int = 0) -> Iterator[Document]:
    """Documents of a text file cut at `separator` (streamed: the file is never held whole).

    Ids are `PATH@N`, N the 0-based piece number counting empty pieces too, so an id does not
    change when another piece becomes empty; `first_piece`: the number of the first piece (a
    byte range of the file starts after that many separators).
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors=base.REPLACE_COUNTER.name)
    with (opener() if opener else open_binary(path)) as fh:
        chunk = base.sniff_stream(fh, path)
        rest = ""
        piece = first_piece
        while True:
            before = base.REPLACE_COUNTER.count
            final = not chunk
            rest += decoder.decode(chunk, final=final)
            bad = base.REPLACE_COUNTER.count - before
            if bad:  # attributed to the piece being read; close enough for a count
                stats.undecodable_sequences += bad
                stats.documents_with_undecodable += 1
            parts = rest.split(separator)
            rest = parts.pop() if not final else ""
            for text in parts:
                if text.strip():
                    stats.documents += 1
                    yield Document(text, f"{path}@{piece}", str(path))
                piece += 1
            if final:
                break
            chunk = fh.read(4 << 20)


class _Range(base.RawWrapper):
    """Bytes [start, end) of a file, as a stream."""

    def __init__(self, path: Path, start: int, end: int):
        self._fh = open(path, "rb")
        self._fh.seek(start)
        self._left = end - start

    def readinto(self, b) -> int:
        n = self._fh.readinto(memoryview(b)[:min(len(b), self._left)]) if self._left > 0 else 0
        self._left -= n
        return n


#: bytes read at a time when looking for separators.
_SCAN_BYTES = 8 << 20


def separator_ranges(path: Path, separator: str, target_bytes: int) -> list[tuple[int, int, int]]:
    """Byte ranges of an uncompressed UTF-8 text file, each about `target_bytes`, cut just after a separator.

    Returns [(start, end, separators before start)]: reading each range with
    `read_text_separated(..., first_piece=that count)` gives the documents, ids included, that
    reading the whole file gives (the separator's UTF-8 bytes are found left to right without
    overlap, as `str.split` finds it; a UTF-8 decoder never joins an ASCII or lead byte to an
    invalid sequence before it). One range [(0, size, 0)] when the file is small or has no
    separator after the first `target_bytes`. Reads the file once, `_SCAN_BYTES` at a time.
    """
    sep = separator.encode("utf-8", "surrogatepass")
    size = path.stat().st_size
    ranges: list[tuple[int, int, int]] = []
    start, start_count = 0, 0
    count = 0  # separators whose end is at or before `base + resume`
    base = 0  # file offset of buf[0]
    buf = b""
    resume = 0  # index in buf where the next search starts (after the last match)
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(_SCAN_BYTES)
            buf = buf[resume:] + chunk
            base += resume
            resume = 0
            while True:
                k = buf.find(sep, resume)
                if k < 0:
                    break
                resume = k + len(sep)
                count += 1
                if base + k >= start + target_bytes and base + resume < size:
                    ranges.append((start, base + resume, start_count))
                    start, start_count = base + resume, count
            if not chunk:
                break
            resume = max(resume, len(buf) - len(sep) + 1)  # a match may straddle the next chunk
    ranges.append((start, size, start_count))
    return ranges


def read_text_range(path: Path, stats: ReadStats, separator: str, start: int, end: int,
                    first_piece: int) -> Iterator[Document]:
    """The documents of bytes [start, end) of an uncompressed UTF-8 text file cut at `separator`
    (a range from `separator_ranges`), with the ids the whole file's reading gives them."""
    yield from read_text_separated(path, stats, separator,
                                    lambda: io.BufferedReader(_Range(path, start, end), buffer_size=1 << 20),
                                    first_piece)
