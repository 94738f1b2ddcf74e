"""Text encodings: UTF-16/32 byte-order marks, --encoding, and whole-file text reading."""

from __future__ import annotations

import codecs
import io
import logging
from pathlib import Path
from typing import BinaryIO

from gptforge.data.readers.base import BadFileError, Prefixed, RawWrapper, ReadStats, decode_utf8, sniff_stream
from gptforge.data.readers.files import open_binary
from gptforge.errors import InputError

log = logging.getLogger("gptforge.data")


BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
        (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def bom_encoding(head: bytes) -> str | None:
    """"utf-32" / "utf-16" when `head` starts with that encoding's byte-order mark, else None.

    (The UTF-8 BOM is left to normalization, which drops it.) The returned codec names read
    the BOM and pick the byte order from it.
    """
    for bom, name in BOMS:
        if head.startswith(bom):
            return name
    return None


class _Utf8Transcoder(RawWrapper):
    """A binary stream of UTF-8 re-encoded from `fh` read as `encoding` (invalid input -> U+FFFD)."""

    def __init__(self, fh: BinaryIO, encoding: str):
        self._fh = fh
        self._decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
        self._buf = memoryview(b"")
        self._eof = False

    def readinto(self, b) -> int:
        while not self._buf and not self._eof:
            chunk = self._fh.read(1 << 20)
            self._eof = not chunk
            self._buf = memoryview(self._decoder.decode(chunk, final=self._eof).encode("utf-8", "surrogatepass"))
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def text_encoding_of(head: bytes, encoding: str | None = None) -> str | None:
    """The codec to read a text file with when it is not plain UTF-8: its BOM's, else `encoding`.

    None means UTF-8 (the default, also for `encoding` "utf-8"/"utf8").
    """
    found = bom_encoding(head)
    if found:
        return found
    if encoding and codecs.lookup(encoding).name not in ("utf-8", "utf-8-sig"):
        return encoding
    return None


def transcoding_opener(path: Path, stats: ReadStats, opener=None):
    """`opener` (or one for `path`) that yields UTF-8 when the file has a UTF-16/32 BOM or
    `stats.encoding` names another encoding; the same opener otherwise.

    A real file is peeked at and opened again; a one-shot `opener` (a tar member) is opened
    once here and its stream handed on with the peeked bytes in front.
    """
    if opener is None:
        with open_binary(path) as fh:
            head = fh.read(4)
        enc = text_encoding_of(head, stats.encoding)
        if enc is None:
            return None
        return lambda: io.BufferedReader(_Utf8Transcoder(open_binary(path), enc), buffer_size=1 << 20)
    fh = opener()
    head = fh.read(4)
    enc = text_encoding_of(head, stats.encoding)
    stream: io.RawIOBase = Prefixed(head, fh, owns=True)
    if enc is not None:
        stream = _Utf8Transcoder(io.BufferedReader(stream), enc)
    return lambda: io.BufferedReader(stream, buffer_size=1 << 20)


def read_text_file(path: str | Path, encoding: str | None = None) -> str:
    """The text of one file, as `prepare` reads a .txt: binary detection, BOM-named UTF-16/32.

    Args:
        path: a plain or compressed (.gz/.zst/.bz2/.xz) text file.
        encoding: the encoding of a file without a BOM (default UTF-8; invalid UTF-8 sequences
            become U+FFFD).

    Raises:
        MissingInputError: no such file.
        InputError: the file looks binary (NUL bytes or mostly invalid UTF-8), or `encoding` is
            not a codec Python knows.
    """
    from gptforge.errors import MissingInputError

    path = Path(path)
    if not path.is_file():
        raise MissingInputError(f"{path}: no such file")
    if encoding:
        try:
            codecs.lookup(encoding)
        except LookupError as e:
            raise InputError(f"--encoding {encoding!r}: not an encoding Python knows (e.g. utf-8, utf-16-le, "
                             f"latin-1, cp1252)") from e
    stats = ReadStats(quiet=True, strict=True, encoding=encoding)
    opener = transcoding_opener(path, stats) or (lambda: open_binary(path))
    with opener() as fh:
        try:
            head = sniff_stream(fh, path)
        except BadFileError as e:
            raise InputError(f"{e}; not scored as text") from e
        data = head + fh.read()
    text, _ = decode_utf8(data)
    return text[1:] if text.startswith("\ufeff") else text
