""".jsonl / .json: one document per JSON line, or a JSON array read whole."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from gptforge.data.readers.base import BadFileError, Document, ReadStats, _meta_of, _sniff_stream, _text_of, decode_utf8
from gptforge.data.readers.files import RawWrapper, open_binary, split_suffixes

log = logging.getLogger("gptforge.data")


def _read_json(path: Path, stats: ReadStats, text_field: str, opener=None) -> Iterator[Document]:
    with (opener() if opener else open_binary(path)) as fh:
        head = _sniff_stream(fh, path)
        first = head.lstrip()[:1]
        if first == b"[":
            yield from _read_json_whole(path, head + fh.read(), stats, text_field)
            return
        stream = io.BufferedReader(_Prefixed(head, fh), buffer_size=1 << 20)
        lineno = 0
        for raw in stream:  # bytes lines of any length
            lineno += 1
            where = f"{path}:{lineno}"
            if not raw.strip():
                continue
            line, bad = decode_utf8(raw)
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                if lineno == 1 and ext_is_json(path):
                    # A pretty-printed single object: not JSON lines; read the file whole.
                    rest = raw + stream.read()
                    try:
                        yield from _read_json_whole(path, rest, stats, text_field)
                        return
                    except BadFileError:
                        pass
                stats.skip_record("bad_json", f"{where}: skipping a line that is not valid JSON ({e.msg.removesuffix(' at')} "
                                  f"at column {e.colno})")
                continue
            text = _text_of(record, text_field, where, stats)
            if text is None:
                continue
            if bad:
                stats.undecodable_sequences += bad
                stats.documents_with_undecodable += 1
            stats.documents += 1
            yield {"id": f"{path}:{lineno}", "text": text, "meta": _meta_of(record, text_field, str(path))}


def ext_is_json(path: Path) -> bool:
    return split_suffixes(path)[0] == ".json"


class _Prefixed(RawWrapper):
    """A raw stream that first returns `head` (already sniffed) then the rest of `fh`; with
    `owns`, closing it closes `fh` too (a peeked one-shot stream)."""

    def __init__(self, head: bytes, fh: BinaryIO, owns: bool = False):
        self._head = memoryview(head)
        self._fh, self._owns = fh, owns

    def readinto(self, b) -> int:
        if self._head.nbytes:
            n = min(len(b), self._head.nbytes)
            b[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        data = self._fh.read(len(b))
        n = len(data)
        b[:n] = data
        return n


def _read_json_whole(path: Path, data: bytes, stats: ReadStats, text_field: str) -> Iterator[Document]:
    text, bad = decode_utf8(data)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadFileError("bad_json", f"{path}: not valid JSON ({e.msg.removesuffix(' at')} at line {e.lineno} column {e.colno})") from e
    items = value if isinstance(value, list) else [value]
    for i, record in enumerate(items):
        where = f"{path}#{i}"
        t = _text_of(record, text_field, where, stats)
        if t is None:
            continue
        if bad:
            stats.undecodable_sequences += bad
            stats.documents_with_undecodable += 1
            bad = 0
        stats.documents += 1
        yield {"id": where, "text": t, "meta": _meta_of(record, text_field, str(path))}
