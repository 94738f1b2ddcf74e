""".parquet: one document per row, read row group by row group."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import gptforge.data.readers.base as base
from gptforge.data.readers.base import Document, Opener, Reader, ReadOptions, ReadStats
from gptforge.data.readers.files import local_copy, split_suffixes

log = logging.getLogger("gptforge.data")


class ParquetReader(Reader):
    """Rows of a Parquet file (`PATH#ROW`); a compressed one is expanded to a temporary file
    first, since Parquet needs random access (footer first)."""

    extensions = frozenset(base.PARQUET_EXTS)
    transcode = False

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        return head.startswith(b"PAR1")

    def read(self, path: Path, stats: ReadStats, options: ReadOptions, opener: Opener | None = None) -> Iterator[Document]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        with local_copy(path, opener, ".parquet", bool(split_suffixes(path)[1] or opener)) as local:
            try:
                pf = pq.ParquetFile(local)
            except (pa.ArrowException, OSError) as e:
                raise base.BadFileError("bad_parquet", f"{path}: not a readable Parquet file ({e})") from e
            names = pf.schema_arrow.names
            name = base.resolve_text_field(options.text_field, names)
            if name is None:
                raise base.BadFileError("missing_field", f"{path}: no column {base.field_label(options.text_field)} (columns: "
                                   f"{', '.join(names[:12])}); choose the column with --text-field")
            row = 0
            try:
                for rg in range(pf.num_row_groups):
                    column = pf.read_row_group(rg, columns=[name]).column(0)
                    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
                        raise base.BadFileError("field_not_string", f"{path}: column {name!r} has type "
                                           f"{column.type}, not string")
                    values = column.to_pylist()
                    yield from base.column_documents(path, values, row, name, stats, "missing_field")
                    row += len(values)
            except pa.ArrowException as e:
                raise base.BadFileError("bad_parquet", f"{path}: damaged Parquet file after row {row} ({e}); "
                                   f"kept the rows before it") from e
