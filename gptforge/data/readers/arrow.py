""".arrow (Hugging Face datasets' cache files): one document per row."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import gptforge.data.readers.base as base
from gptforge.data.readers.base import Document, Opener, Reader, ReadOptions, ReadStats
from gptforge.data.readers.files import local_copy

log = logging.getLogger("gptforge.data")


class ArrowReader(Reader):
    """Rows of an Arrow IPC file or stream (Hugging Face `save_to_disk` writes streams); ids `PATH#ROW`."""

    extensions = frozenset(base.ARROW_EXTS)
    transcode = False

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        return head.startswith(b"ARROW1")  # the IPC file format's magic

    def read(self, path: Path, stats: ReadStats, options: ReadOptions, opener: Opener | None = None) -> Iterator[Document]:
        import pyarrow as pa

        with local_copy(path, opener, ".arrow", bool(opener)) as local:
            source = pa.memory_map(str(local))
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
                raise base.BadFileError("bad_arrow", f"{path}: not a readable Arrow file ({e})") from e
            name = base.resolve_text_field(options.text_field, schema.names)
            if name is None:
                raise base.BadFileError("missing_field", f"{path}: no column {base.field_label(options.text_field)} (columns: "
                                   f"{', '.join(schema.names[:12])}); choose the column with --text-field")
            row = 0
            try:
                for batch in batches:
                    values = batch.column(schema.get_field_index(name)).to_pylist()
                    yield from base.column_documents(path, values, row, name, stats, "field_not_string")
                    row += len(values)
            except pa.ArrowException as e:
                raise base.BadFileError("bad_arrow", f"{path}: damaged Arrow file after row {row} ({e}); kept the rows "
                                   f"before it") from e
