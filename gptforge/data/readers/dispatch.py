"""One file to documents: choose the reader by extension, skip and count what cannot be read."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

from gptforge.data.readers.arrow import _read_arrow
from gptforge.data.readers.base import (
    ARROW_EXTS,
    CSV_EXTS,
    HF_PREFIX,
    JSON_EXTS,
    PARQUET_EXTS,
    SNIFF_BYTES,
    TAR_EXTS,
    BadFileError,
    BadInputError,
    Document,
    ReadStats,
)
from gptforge.data.readers.csv import _read_csv
from gptforge.data.readers.encoding import _transcoding_opener
from gptforge.data.readers.files import _TruncatedArchive, expand_inputs, open_binary, split_suffixes
from gptforge.data.readers.hf import _read_hf
from gptforge.data.readers.jsonl import _read_json
from gptforge.data.readers.parquet import _read_parquet
from gptforge.data.readers.tar import _read_tar
from gptforge.data.readers.text import _read_text, read_text_range, separator_ranges

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
        if str(path).startswith(HF_PREFIX):
            yield from _read_hf(str(path), stats, text_field)
        else:
            stats.input_bytes += path.stat().st_size
            yield from _read_format(path, ext, stats, text_field, doc_separator)
        stats.files_read += 1
    except BadFileError as e:
        stats.skip_file(e.reason, f"skipping {e}")
    except _TruncatedArchive as e:
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
    from gptforge.data.readers.base import sniff_binary
    from gptforge.data.readers.encoding import text_encoding_of

    if not doc_separator or str(path).startswith(HF_PREFIX):
        return None
    ext, comp = split_suffixes(path)
    if comp or ext in PARQUET_EXTS | ARROW_EXTS | JSON_EXTS | CSV_EXTS | TAR_EXTS:
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


def _read_format(path: Path, ext: str, stats: ReadStats, text_field: str, doc_separator: str | None,
                 opener=None) -> Iterator[Document]:
    """Dispatch on the format extension; `opener()` gives the (decompressed) bytes when `path`
    is not a real file (a tar member). Text formats (.txt, .md, .jsonl, .json, .csv, unknown
    extensions) with a UTF-16/32 BOM, or in `stats.encoding`, are read as UTF-8 re-encoded."""
    if ext not in PARQUET_EXTS and ext not in ARROW_EXTS and ext not in TAR_EXTS:
        opener = _transcoding_opener(path, stats, opener)
    if ext in PARQUET_EXTS:
        yield from _read_parquet(path, stats, text_field, opener)
    elif ext in ARROW_EXTS:
        yield from _read_arrow(path, stats, text_field, opener)
    elif ext in JSON_EXTS:
        yield from _read_json(path, stats, text_field, opener)
    elif ext in CSV_EXTS:
        yield from _read_csv(path, stats, text_field, opener)
    elif ext in TAR_EXTS:
        with (opener() if opener else open_binary(path)) as fh:
            yield from _read_tar(path, fh, stats, text_field, doc_separator, _read_format)
    else:
        yield from _read_text(path, stats, doc_separator, opener)


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
