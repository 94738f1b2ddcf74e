""".arrow (Hugging Face datasets' cache files): one document per row."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from gptforge.data.readers.base import BadFileError, Document, ReadStats, _field_label, resolve_text_field

log = logging.getLogger("gptforge.data")


def _read_arrow(path: Path, stats: ReadStats, text_field: str, opener=None) -> Iterator[Document]:
    """Rows of an Arrow IPC file or stream (Hugging Face `save_to_disk` writes streams); ids `PATH#ROW`."""
    import pyarrow as pa

    tmp_path = None
    try:
        if opener:
            fd, tmp_path = tempfile.mkstemp(suffix=".arrow", prefix="gptforge-")
            with os.fdopen(fd, "wb") as out, opener() as src:
                shutil.copyfileobj(src, out, 1 << 20)
        source = pa.memory_map(tmp_path or str(path))
        try:
            try:
                reader = pa.ipc.open_stream(source)
                batches = iter(reader)
                schema = reader.schema
            except pa.ArrowInvalid:
                source.seek(0)
                f = pa.ipc.open_file(source)
                batches = (f.get_batch(i) for i in range(f.num_record_batches))
                schema = f.schema
        except (pa.ArrowException, OSError) as e:
            raise BadFileError("bad_arrow", f"{path}: not a readable Arrow file ({e})") from e
        name = resolve_text_field(text_field, schema.names)
        if name is None:
            raise BadFileError("missing_field", f"{path}: no column {_field_label(text_field)} (columns: "
                               f"{', '.join(schema.names[:12])}); choose the column with --text-field")
        row = 0
        try:
            for batch in batches:
                for value in batch.column(schema.get_field_index(name)).to_pylist():
                    if not isinstance(value, str):
                        stats.skip_record("field_not_string", f"{path}#{row}: skipping a row whose {name!r} "
                                          f"is {type(value).__name__}")
                    else:
                        stats.documents += 1
                        yield {"id": f"{path}#{row}", "text": value, "meta": {"source": str(path)}}
                    row += 1
        except pa.ArrowException as e:
            raise BadFileError("bad_arrow", f"{path}: damaged Arrow file after row {row} ({e}); kept the rows "
                               f"before it") from e
    finally:
        if tmp_path:
            os.unlink(tmp_path)
