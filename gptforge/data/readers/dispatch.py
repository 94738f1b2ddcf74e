"""One file to documents: choose the reader (by extension, else by sniffed content, else text),
skip and count what cannot be read."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

from gptforge.data.readers.arrow import ArrowReader
from gptforge.data.readers.base import (
    HF_PREFIX,
    READERS,
    SNIFF_BYTES,
    BadFileError,
    BadInputError,
    Document,
    Opener,
    Reader,
    ReadOptions,
    ReadStats,
    sniff_binary,
)
from gptforge.data.readers.csv import CsvReader
from gptforge.data.readers.encoding import text_encoding_of, transcoding_opener
from gptforge.data.readers.files import TruncatedArchive, expand_inputs, open_binary, split_suffixes
from gptforge.data.readers.hf import HFReader
from gptforge.data.readers.jsonl import JsonReader
from gptforge.data.readers.parquet import ParquetReader
from gptforge.data.readers.tar import TarReader
from gptforge.data.readers.text import TextReader, read_text_range, separator_ranges

#: the built-in readers, registered when their classes are defined (`base.Reader`).
BUILTIN_READERS = (TextReader, JsonReader, CsvReader, ParquetReader, ArrowReader, TarReader)

log = logging.getLogger("gptforge.data")


def read_file(path: Path, stats: ReadStats, text_field: str = "text",
              doc_separator: str | None = None) -> Iterator[Document]:
    """Yield the documents of one file, skipping and counting what cannot be read.

    A truncated/damaged `.gz`/`.zst` archive keeps every complete document read before the
    damage, drops the rest of the file (including a partly read document), warns and counts
    `files_truncated`. A binary or unreadable file yields nothing and is counted in
    `stats.files_skipped`.
    """
    ext, comp = split_suffixes(path)
    try:
        options = ReadOptions(text_field, doc_separator)
        if str(path).startswith(HF_PREFIX):
            yield from HFReader().read(path, stats, options)
        else:
            stats.input_bytes += path.stat().st_size
            yield from read_format(path, ext, stats, options)
        stats.files_read += 1
    except BadFileError as e:
        stats.skip_file(e.reason, f"skipping {e}")
    except TruncatedArchive as e:
        if stats.strict:
            raise BadInputError(f"{e} (--strict: stopping)") from e
        stats.files_truncated += 1
        stats.files_read += 1
        stats.warn(f"{e}: kept the complete documents read before the damage, skipped the rest")
    except OSError as e:
        stats.skip_file("unreadable", f"skipping {path}: cannot read it ({e})")


def read_file_range(path: Path, stats: ReadStats, doc_separator: str, start: int, end: int,
                    first_piece: int) -> Iterator[Document]:
    """The documents of one byte range of a big uncompressed UTF-8 text file (`plan_text_ranges`).

    Counts the range's bytes in `stats.input_bytes`, and the file in `files_read` once (with its
    first range), so the ranges of a file add up to what reading it whole counts.
    """
    try:
        stats.input_bytes += end - start
        yield from read_text_range(path, stats, doc_separator, start, end, first_piece)
        if start == 0:
            stats.files_read += 1
    except BadFileError as e:
        stats.skip_file(e.reason, f"skipping {e}")
    except OSError as e:
        stats.skip_file("unreadable", f"skipping {path}: cannot read it ({e})")


def plan_text_ranges(path: Path, doc_separator: str | None, encoding: str | None,
                     target_bytes: int) -> list[tuple[int, int, int]] | None:
    """Byte ranges of about `target_bytes` for a file read as text and cut at `doc_separator`,
    or None to read it whole.

    Only an uncompressed file of more than 2 * `target_bytes`, of a plain-text format (not JSON,
    CSV, Parquet, Arrow or tar), read as UTF-8 (no UTF-16/32 byte-order mark, no other
    `encoding`) and not binary by its first bytes is cut: a compressed file is streamed instead
    (decompressed in 4 MB chunks, cut at the separator as it comes). Without a separator a file
    is one document and is never cut here (its tokenization is, `gptforge.data.windows`).
    """
    if not doc_separator or str(path).startswith(HF_PREFIX):
        return None
    ext, comp = split_suffixes(path)
    if comp or reader_for(ext) is not TextReader:
        return None
    try:
        if path.stat().st_size <= 2 * target_bytes:
            return None
        with open(path, "rb") as fh:
            head = fh.read(SNIFF_BYTES)
    except OSError:
        return None  # read whole: the reader reports it
    if text_encoding_of(head[:4], encoding) is not None or sniff_binary(head):
        return None
    ranges = separator_ranges(path, doc_separator, target_bytes)
    return ranges if len(ranges) > 1 else None


def reader_for(ext: str, head: bytes | None = None) -> type[Reader]:
    """The reader of a file with format extension `ext`: the registered one for it, else (given
    the file's first bytes `head`) the first whose `sniff` claims them, else `TextReader`."""
    for cls in READERS:
        if ext in cls.extensions:
            return cls
    if head:
        for cls in READERS:
            if cls.sniff(head):
                return cls
    return TextReader


def read_format(path: Path, ext: str, stats: ReadStats, options: ReadOptions, opener: Opener | None = None,
                head: bytes | None = None) -> Iterator[Document]:
    """The documents of one file by its reader (`reader_for`); `opener()` gives the (decompressed)
    bytes when `path` is not a real file (a tar member, whose first bytes are `head`). A text
    format's bytes with a UTF-16/32 BOM, or in `stats.encoding`, are read as UTF-8 re-encoded."""
    if head is None and opener is None and not any(ext in cls.extensions for cls in READERS):
        with open_binary(path) as fh:  # a name without a known extension: sniff its content
            head = fh.read(512)
    cls = reader_for(ext, head)
    if cls.transcode:
        opener = transcoding_opener(path, stats, opener)
    yield from cls(dispatch=read_format).read(path, stats, options, opener)


def read_documents(inputs: Iterable[str | Path], stats: ReadStats | None = None,
                   text_field: str = "text", files: list[Path] | None = None,
                   doc_separator: str | None = None) -> Iterator[Document]:
    """Stream the documents of every input (files, folders, globs), file by file in sorted order.

    Args:
        inputs: paths, folders or glob patterns.
        stats: counters to fill (a fresh one when None).
        text_field: JSON field / Parquet column holding the text.
        files: an already expanded file list (skips `expand_inputs`).

    Raises:
        FileNotFoundError: an input does not exist (raised before any document is yielded).
    """
    stats = stats if stats is not None else ReadStats()
    for path in files if files is not None else expand_inputs(inputs):
        yield from read_file(path, stats, text_field, doc_separator)
