""".tar archives: every member read by its own extension."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import gptforge.data.readers.base as base
from gptforge.data.readers.base import Document, Opener, Reader, ReadOptions, ReadStats
from gptforge.data.readers.files import DecompressRaw, TruncatedArchive, open_binary, split_suffixes

log = logging.getLogger("gptforge.data")


class TarReader(Reader):
    """Members of a tar archive read as files of their own (ids `ARCHIVE/MEMBER...`), streamed.

    Compressed members are decompressed; a member that is itself a tar archive (OpenWebText:
    `.xz` files holding tars of `.txt`) is read recursively. A member is read by the reader of
    its extension, or of its sniffed content (`dispatch.read_format`; text when none claims it).
    A cut compressed archive is detected and counted (`files_truncated`), but Python's `tarfile`
    ends a plain tar stream quietly at a cut: the complete members before it are read, the cut
    member is not, and the truncation is not reported.
    """

    extensions = frozenset(base.TAR_EXTS)
    transcode = False

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        return len(head) >= 262 and head[257:262] == b"ustar"

    def read(self, path: Path, stats: ReadStats, options: ReadOptions, opener: Opener | None = None) -> Iterator[Document]:
        if self.dispatch is None:
            raise ValueError("TarReader reads its members through a dispatcher: make it with dispatch=read_format")
        with (opener() if opener else open_binary(path)) as fh:
            yield from _read_tar(path, fh, stats, options, self.dispatch)


def _read_tar(path: Path, fh: BinaryIO, stats: ReadStats, options: ReadOptions, read_format) -> Iterator[Document]:
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
            stream: BinaryIO = (io.BufferedReader(DecompressRaw(name, comp, fileobj=raw), buffer_size=1 << 20)  # type: ignore[assignment]
                                if comp else raw)
            head = stream.read(512)
            body = io.BufferedReader(base.Prefixed(head, stream), buffer_size=1 << 20)
            if TarReader.sniff(head):
                yield from _read_tar(name, body, stats, options, read_format)
                continue
            opened = [False]

            def opener(b=body, opened=opened, name=name):
                if opened[0]:
                    raise base.BadFileError("unreadable", f"{name}: a tar member can be read once")
                opened[0] = True
                return b
            yield from read_format(name, ext, stats, options, opener, head)
    except tarfile.TarError as e:
        raise TruncatedArchive(f"{path}: damaged tar archive ({e})") from e
