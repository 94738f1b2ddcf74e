""".csv: one document per row (strict parsing; malformed rows reported with file:line)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import gptforge.data.readers.base as base
from gptforge.data.readers.base import Document, Opener, Reader, ReadOptions, ReadStats
from gptforge.data.readers.files import open_binary

log = logging.getLogger("gptforge.data")


class _PushbackLines:
    """An iterator of physical lines that counts them and can give back the last record's tail."""

    def __init__(self, it: Iterator[str]):
        self.it = it
        self.pending: list[str] = []  # lines to read again, next one last
        self.line = 0  # physical lines handed out (1-based number of the last one)
        self.taken: list[str] = []  # lines of the record being parsed

    def __iter__(self) -> _PushbackLines:
        return self

    def __next__(self) -> str:
        line = self.pending.pop() if self.pending else next(self.it)
        self.line += 1
        self.taken.append(line)
        return line

    def give_back(self, lines: list[str]) -> None:
        self.pending.extend(reversed(lines))
        self.line -= len(lines)


class CsvReader(Reader):
    """One document per row (`PATH#ROW`), the other cells its metadata (see `read_csv`)."""

    extensions = frozenset(base.CSV_EXTS)

    def read(self, path: Path, stats: ReadStats, options: ReadOptions, opener: Opener | None = None) -> Iterator[Document]:
        return read_csv(path, stats, options.text_field, opener)


def read_csv(path: Path, stats: ReadStats, text_field: str, opener: Opener | None = None) -> Iterator[Document]:
    """One document per CSV row (header row first); ids `PATH#ROW`, ROW 0-based after the header.

    Parsed strictly (`csv` with strict=True): a row that does not parse, or whose cell count is
    not the header's, is skipped and counted with its `FILE:LINE` (physical line, header = 1).
    A malformed row that ran over several lines (an unclosed quote swallows the lines after it)
    gives those lines back, so only the broken line is lost, not the rows behind it. Blank lines
    are not rows.
    """
    import csv
    import sys

    csv.field_size_limit(sys.maxsize)  # real corpora hold whole articles in one cell
    with (opener() if opener else open_binary(path)) as fh:
        head = base.sniff_stream(fh, path)
        text = io.TextIOWrapper(io.BufferedReader(base.Prefixed(head, fh)), encoding="utf-8",
                                errors=base.REPLACE_COUNTER.name, newline="")
        lines = _PushbackLines(iter(text))
        reader = csv.reader(lines, strict=True)
        try:
            header = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise base.BadFileError("bad_csv", f"{path}:1: not a readable CSV header ({e})") from e
        name = base.resolve_text_field(text_field, header)
        if name is None:
            raise base.BadFileError("missing_field", f"{path}: no column {base.field_label(text_field)} (columns: "
                               f"{', '.join(header[:12])}); choose the column with --text-field")
        col = header.index(name)
        row = -1
        while True:
            lines.taken = []
            start = lines.line + 1
            try:
                values = next(reader)
            except StopIteration:
                break
            except csv.Error as e:
                problem = f"does not parse ({e})"
            else:
                if not values:  # a blank line
                    continue
                problem = (None if len(values) == len(header) else
                           f"has {len(values)} cells, the header {len(header)}")
            row += 1
            if problem is None:
                stats.documents += 1
                stats.count_field(name)
                meta = {h: v for h, v in zip(header, values, strict=True) if h != name}
                yield Document(values[col], f"{path}#{row}", str(path), meta)
                continue
            span = f" (a record over lines {start}-{lines.line}: an unclosed quote?)" if len(lines.taken) > 1 else ""
            stats.skip_record("bad_csv", f"{path}:{start}: skipping a malformed CSV row: it {problem}{span}")
            if len(lines.taken) > 1:
                lines.give_back(lines.taken[1:])
                reader = csv.reader(lines, strict=True)
