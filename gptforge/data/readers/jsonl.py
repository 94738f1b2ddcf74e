""".jsonl / .json: one document per JSON line, or a JSON array read whole."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import gptforge.data.readers.base as base
from gptforge.data.readers.base import Document, Opener, Reader, ReadOptions, ReadStats
from gptforge.data.readers.files import open_binary, split_suffixes

log = logging.getLogger("gptforge.data")


class JsonReader(Reader):
    """One document per JSON line (`PATH:LINE`), or per item of a JSON array file (`PATH#ITEM`)."""

    extensions = frozenset(base.JSON_EXTS)

    def read(self, path: Path, stats: ReadStats, options: ReadOptions, opener: Opener | None = None) -> Iterator[Document]:
        return _read_json(path, stats, options.text_field, opener)


def _read_json(path: Path, stats: ReadStats, text_field: str, opener: Opener | None = None) -> Iterator[Document]:
    with (opener() if opener else open_binary(path)) as fh:
        head = base.sniff_stream(fh, path)
        first = head.lstrip()[:1]
        if first == b"[":
            yield from _read_json_whole(path, head + fh.read(), stats, text_field)
            return
        stream = io.BufferedReader(base.Prefixed(head, fh), buffer_size=1 << 20)
        lineno = 0
        for raw in stream:  # bytes lines of any length
            lineno += 1
            where = f"{path}:{lineno}"
            if not raw.strip():
                continue
            line, bad = base.decode_utf8(raw)
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                if lineno == 1 and ext_is_json(path):
                    # A pretty-printed single object: not JSON lines; read the file whole.
                    rest = raw + stream.read()
                    try:
                        yield from _read_json_whole(path, rest, stats, text_field)
                        return
                    except base.BadFileError:
                        pass
                stats.skip_record("bad_json", f"{where}: skipping a line that is not valid JSON ({e.msg.removesuffix(' at')} "
                                  f"at column {e.colno})")
                continue
            text = base.text_of(record, text_field, where, stats)
            if text is None:
                continue
            stats.count_undecodable(bad)
            stats.documents += 1
            yield Document(text, f"{path}:{lineno}", str(path), base.metadata_of(record, text_field))


def ext_is_json(path: Path) -> bool:
    return split_suffixes(path)[0] == ".json"


def _read_json_whole(path: Path, data: bytes, stats: ReadStats, text_field: str) -> Iterator[Document]:
    text, bad = base.decode_utf8(data)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise base.BadFileError("bad_json", f"{path}: not valid JSON ({e.msg.removesuffix(' at')} at line {e.lineno} column {e.colno})") from e
    items = value if isinstance(value, list) else [value]
    for i, record in enumerate(items):
        where = f"{path}#{i}"
        t = base.text_of(record, text_field, where, stats)
        if t is None:
            continue
        stats.count_undecodable(bad)
        bad = 0
        stats.documents += 1
        yield Document(t, where, str(path), base.metadata_of(record, text_field))
