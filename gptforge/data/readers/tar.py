""".tar archives: every member read by its own extension."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from gptforge.data.readers.base import BadFileError, Document, ReadStats
from gptforge.data.readers.files import _DecompressRaw, _TruncatedArchive, split_suffixes
from gptforge.data.readers.jsonl import _Prefixed

log = logging.getLogger("gptforge.data")


def _read_tar(path: Path, fh: BinaryIO, stats: ReadStats, text_field: str,
              doc_separator: str | None, read_format) -> Iterator[Document]:
    """Members of a tar archive read as files of their own (ids `ARCHIVE/MEMBER...`), streamed.

    Compressed members are decompressed; a member that is itself a tar archive (OpenWebText:
    `.xz` files holding tars of `.txt`) is read recursively. A member without a known extension
    is read as text (`read_format` is the dispatcher, `dispatch._read_format`). A cut compressed archive is detected and counted (`files_truncated`), but
    Python's `tarfile` ends a plain tar stream quietly at a cut: the complete members before it
    are read, the cut member is not, and the truncation is not reported.
    """
    import tarfile

    try:
        tar = tarfile.open(fileobj=fh, mode="r|")
        for member in tar:
            if not member.isfile():
                continue
            name = Path(f"{path}/{member.name}")
            ext, comp = split_suffixes(member.name)
            raw = tar.extractfile(member)
            if raw is None:
                continue
            stream: BinaryIO = (io.BufferedReader(_DecompressRaw(name, comp, fileobj=raw), buffer_size=1 << 20)  # type: ignore[assignment]
                                if comp else raw)
            head = stream.read(512)
            body = io.BufferedReader(_Prefixed(head, stream), buffer_size=1 << 20)
            if len(head) >= 262 and head[257:262] == b"ustar":
                yield from _read_tar(name, body, stats, text_field, doc_separator, read_format)
                continue
            opened = [False]

            def opener(b=body, opened=opened, name=name):
                if opened[0]:
                    raise BadFileError("unreadable", f"{name}: a tar member can be read once")
                opened[0] = True
                return b
            yield from read_format(name, ext, stats, text_field, doc_separator, opener)
    except tarfile.TarError as e:
        raise _TruncatedArchive(f"{path}: damaged tar archive ({e})") from e
