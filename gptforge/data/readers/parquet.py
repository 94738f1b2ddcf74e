""".parquet: one document per row, read row group by row group."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from gptforge.data.readers.base import BadFileError, Document, ReadStats, _field_label, resolve_text_field
from gptforge.data.readers.files import open_binary, split_suffixes

log = logging.getLogger("gptforge.data")


def _read_parquet(path: Path, stats: ReadStats, text_field: str, opener=None) -> Iterator[Document]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    comp = split_suffixes(path)[1]
    tmp_path = None
    try:
        if comp or opener:
            # Parquet needs random access (footer first); a compressed copy is expanded to disk.
            fd, tmp_path = tempfile.mkstemp(suffix=".parquet", prefix="gptforge-")
            with os.fdopen(fd, "wb") as out, (opener() if opener else open_binary(path)) as src:
                shutil.copyfileobj(src, out, 1 << 20)
        try:
            pf = pq.ParquetFile(tmp_path or path)
        except (pa.ArrowException, OSError) as e:
            raise BadFileError("bad_parquet", f"{path}: not a readable Parquet file ({e})") from e
        names = pf.schema_arrow.names
        column_name = resolve_text_field(text_field, names)
        if column_name is None:
            raise BadFileError("missing_field", f"{path}: no column {_field_label(text_field)} (columns: "
                               f"{', '.join(names[:12])}); choose the column with --text-field")
        text_field = column_name
        row = 0
        try:
            for rg in range(pf.num_row_groups):
                table = pf.read_row_group(rg, columns=[text_field])
                column = table.column(0)
                if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
                    raise BadFileError("field_not_string", f"{path}: column {text_field!r} has type "
                                       f"{column.type}, not string")
                for value in column.to_pylist():
                    if value is None:
                        stats.skip_record("missing_field", f"{path}#{row}: skipping a row whose "
                                          f"{text_field!r} is null")
                    else:
                        stats.documents += 1
                        yield {"id": f"{path}#{row}", "text": value, "meta": {"source": str(path)}}
                    row += 1
        except pa.ArrowException as e:
            raise BadFileError("bad_parquet", f"{path}: damaged Parquet file after row {row} ({e}); "
                               f"kept the rows before it") from e
    finally:
        if tmp_path:
            os.unlink(tmp_path)
