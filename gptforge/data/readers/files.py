"""Inputs to files (folders, globs, compression suffixes) and decompressing streams."""

from __future__ import annotations

import contextlib
import glob
import io
import logging
import os
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO

from gptforge.data.readers.base import COMPRESSION_EXTS, HF_PREFIX, SUPPORTED_EXTS, RawWrapper
from gptforge.data.readers.hf import hf_dataset_folder

log = logging.getLogger("gptforge.data")


# --------------------------------------------------------------------------------------------
# Finding files
# --------------------------------------------------------------------------------------------


def split_suffixes(path: str | Path) -> tuple[str, str]:
    """(format extension, compression extension) of a file name, both lower-case with the dot.

    `a.jsonl.gz` -> (".jsonl", ".gz"); `a.txt` -> (".txt", ""); `README` -> ("", "").
    """
    name = Path(path).name.lower()
    stem, ext = os.path.splitext(name)
    comp = ""
    if ext in COMPRESSION_EXTS:
        comp = ext
        stem, ext = os.path.splitext(stem)
    return ext, comp


def _is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def expand_inputs(inputs: Iterable[str | Path]) -> list[Path]:
    """Turn files, folders and glob patterns into a sorted-per-input list of files.

    Folders are walked recursively for files whose extension (after one of `COMPRESSION_EXTS`) is one of
    `SUPPORTED_EXTS`; hidden files and folders (names starting with ".") are left out. An
    explicitly named file is always read, whatever its extension (as text when unknown).

    Raises:
        FileNotFoundError: an input path does not exist or a glob matches nothing (the message
            names it).
        ValueError: no inputs at all.
    """
    files: list[Path] = []
    seen: set[str] = set()
    inputs = list(inputs)
    if not inputs:
        raise ValueError("no input given: name at least one file, folder or glob")
    for raw in inputs:
        raw = str(raw)
        if raw.startswith(HF_PREFIX):
            if raw not in seen:
                seen.add(raw)
                files.append(Path(raw))
            continue
        if _is_glob(raw) and not os.path.exists(raw):
            matches = sorted(glob.glob(raw, recursive=True))
            if not matches:
                raise FileNotFoundError(f"input glob {raw!r} matches no file")
            candidates = []
            for m in matches:
                p = Path(os.path.normpath(m))
                candidates.extend(_walk(p) if p.is_dir() else [p])
        else:
            p = Path(os.path.normpath(raw))
            if not p.exists():
                raise FileNotFoundError(f"input path {raw!r} does not exist")
            candidates = _walk(p) if p.is_dir() else [p]
        for c in candidates:
            key = str(c)
            if key not in seen:
                seen.add(key)
                files.append(c)
    return files


def _walk(folder: Path) -> list[Path]:
    found = []
    keys: dict[Path, tuple[str, ...]] = {}
    for root, dirs, names in os.walk(folder):
        hf = hf_dataset_folder(root, names)
        if hf is not None:
            for i, f in enumerate(hf):
                keys[f] = f.parent.parts + (f"\x00{i:09d}",)
            found.extend(hf)
            dirs[:] = []
            continue
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if name.startswith("."):
                continue
            if split_suffixes(name)[0] in SUPPORTED_EXTS:
                found.append(Path(os.path.normpath(os.path.join(root, name))))
    # Sorted by path components, so the order is the same on every file system (files of one
    # Hugging Face dataset folder stay in their state.json order).
    return sorted(found, key=lambda p: keys.get(p) or p.parts)


# --------------------------------------------------------------------------------------------
# Reading one file
# --------------------------------------------------------------------------------------------


class TruncatedArchive(Exception):
    """A compressed file or tar archive damaged or cut short (the readable part before it was read)."""


class DecompressRaw(RawWrapper):
    """Streaming decompression (gzip or zstd) that keeps everything before a damaged spot.

    Compressed bytes are fed in 256 KiB chunks to a decompress object; the output is served as
    it comes, so a truncated archive yields all the text before the cut and then raises
    `TruncatedArchive`. Each member/frame must reach its end marker (zstandard's own
    `stream_reader` ends quietly at a cut-off frame, which would pass a half-written archive
    off as complete). Concatenated members/frames (`cat a.gz b.gz`) are read in turn.
    """

    def __init__(self, path: Path, kind: str, fileobj: IO[bytes] | None = None):
        # a factory of decompress objects (zlib, bz2, lzma and zstandard ones share the API used here)
        self._new: Callable[[], Any]
        if kind == ".gz":
            self._new = lambda: zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip header + trailer
            self._errors: tuple[type[BaseException], ...] = (zlib.error,)
        elif kind == ".bz2":
            import bz2

            self._new = bz2.BZ2Decompressor
            self._errors = (OSError, EOFError, ValueError)
        elif kind == ".xz":
            import lzma

            self._new = lzma.LZMADecompressor
            self._errors = (lzma.LZMAError, EOFError)
        else:
            import zstandard

            dctx = zstandard.ZstdDecompressor()
            self._new = dctx.decompressobj
            self._errors = (zstandard.ZstdError,)
        self._fh = fileobj if fileobj is not None else open(path, "rb")
        self._path = path
        self._kind = kind
        self._dobj = self._new()
        self._fed = False
        self._buf = b""
        self._pos = 0
        self._done = False

    def _feed(self, chunk: bytes) -> None:
        while chunk:
            try:
                out = self._dobj.decompress(chunk)
            except self._errors as e:
                raise TruncatedArchive(f"{self._path}: damaged {self._kind} archive ({e})") from e
            self._buf = self._buf[self._pos:] + out if self._pos < len(self._buf) else out
            self._pos = 0
            self._fed = True
            if self._dobj.eof:
                chunk = self._dobj.unused_data
                self._dobj = self._new()
                self._fed = False
                if self._kind == ".gz" and not chunk.strip(b"\x00"):
                    chunk = b""  # zero padding after the last member is allowed (as gzip(1) does)
            else:
                chunk = b""

    def readinto(self, b) -> int:
        while self._pos == len(self._buf) and not self._done:
            chunk = self._fh.read(256 * 1024)
            if not chunk:
                self._done = True
                if self._fed:
                    raise TruncatedArchive(f"{self._path}: truncated {self._kind} archive "
                                            f"(it ends before its end-of-stream marker)")
                break
            self._feed(chunk)
        n = min(len(b), len(self._buf) - self._pos)
        b[:n] = self._buf[self._pos:self._pos + n]
        self._pos += n
        if self._pos == len(self._buf):
            self._buf, self._pos = b"", 0
        return n


def open_binary(path: Path) -> BinaryIO:
    """Open `path` for reading bytes, decompressing `.gz`/`.zst` on the fly (streaming).

    Reading a damaged or truncated archive raises `TruncatedArchive` at the damage.
    """
    comp = split_suffixes(path)[1]
    if comp not in COMPRESSION_EXTS:
        return open(path, "rb")
    raw = DecompressRaw(path, comp)
    return io.BufferedReader(raw, buffer_size=1 << 20)


@contextlib.contextmanager
def local_copy(path: Path, opener: Callable[[], BinaryIO] | None, suffix: str, needed: bool) -> Iterator[Path]:
    """`path` itself, or with `needed` a temporary file holding its (decompressed) bytes, for
    formats that need random access (Parquet's footer, Arrow's memory map); removed after."""
    if not needed:
        yield path
        return
    fd, tmp = tempfile.mkstemp(suffix=suffix, prefix="gptforge-")
    try:
        with os.fdopen(fd, "wb") as out, (opener() if opener else open_binary(path)) as src:
            shutil.copyfileobj(src, out, 1 << 20)
        yield Path(tmp)
    finally:
        os.unlink(tmp)


def source_size(path: str | Path) -> int:
    """Bytes of an input as stored (0 for a `hf:` dataset name or a file that vanished)."""
    if str(path).startswith(HF_PREFIX):
        return 0
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
