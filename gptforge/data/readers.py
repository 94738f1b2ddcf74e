"""Stream documents `{"id", "text", "meta"}` out of files, folders and globs.

Formats (chosen by file name; compression suffix first):

- `.txt`, `.md` (and any explicitly named file of another extension): one document per file.
- `.jsonl`, `.json`: one document per JSON line, text in `text_field`; a `.json` file holding a
  JSON array (or one object) is read whole.
- `.parquet`: one document per row, text in the `text_field` column, read row group by row group.
- Any of the above compressed as `.gz` or `.zst` (`.parquet.gz` is decompressed to a temporary
  file first, since Parquet needs random access).

Document ids are stable: the input path (as given, normalized with `os.path.normpath`) plus
`:LINE` (1-based, JSON lines), `#ROW` (0-based, Parquet rows and JSON array items), or nothing
(one document per file). They do not depend on reading order, so a split decided by hashing them
is reproducible.

Bad input never stops a run of many files: a binary file, a truncated archive, a malformed JSON
line, a missing text field or an unreadable Parquet file is skipped with a warning naming the file
(and line) and counted in `ReadStats`. A path that does not exist is an error (`FileNotFoundError`)
before anything is read: it is almost always a typo.
"""

from __future__ import annotations

import codecs
import glob
import io
import json
import logging
import os
import shutil
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from gptforge.errors import InputError

log = logging.getLogger("gptforge.data")

HF_PREFIX = "hf:"
#: with text_field "auto": the fields real corpora keep their text in, tried in this order
#: (`text` most datasets, `story` TinyStories, `content` The Stack, `raw_content` RedPajama).
AUTO_TEXT_FIELDS = ("text", "story", "content", "raw_content")


def resolve_text_field(text_field: str, available) -> str | None:
    """The field to read: `text_field` itself, or with "auto" the first of `AUTO_TEXT_FIELDS` in
    `available` (None when none is)."""
    if text_field != "auto":
        return text_field if text_field in available else None
    for name in AUTO_TEXT_FIELDS:
        if name in available:
            return name
    return None


def _field_label(text_field: str) -> str:
    return f"any of {', '.join(AUTO_TEXT_FIELDS)}" if text_field == "auto" else repr(text_field)
#: extensions a folder walk picks up (after removing a compression suffix).
TEXT_EXTS = {".txt", ".md"}
JSON_EXTS = {".jsonl", ".json"}
PARQUET_EXTS = {".parquet"}
ARROW_EXTS = {".arrow"}
CSV_EXTS = {".csv"}
TAR_EXTS = {".tar"}
COMPRESSION_EXTS = {".gz", ".zst", ".bz2", ".xz"}
SUPPORTED_EXTS = TEXT_EXTS | JSON_EXTS | PARQUET_EXTS | ARROW_EXTS | CSV_EXTS | TAR_EXTS

#: bytes examined to decide that a file is binary.
SNIFF_BYTES = 64 * 1024
#: a file whose first SNIFF_BYTES decode with more than this fraction of invalid bytes is binary.
BINARY_INVALID_FRACTION = 0.10
#: warnings kept verbatim in the stats (the rest are only counted).
MAX_KEPT_WARNINGS = 50

Document = dict[str, Any]


@dataclass
class ReadStats:
    """Counters filled while reading; every skipped thing is counted under one reason."""

    files_read: int = 0
    documents: int = 0
    input_bytes: int = 0  # bytes of the files as stored (compressed size for .gz/.zst)
    undecodable_sequences: int = 0  # invalid UTF-8 sequences replaced by U+FFFD
    documents_with_undecodable: int = 0
    files_skipped: dict[str, int] = field(default_factory=dict)  # reason -> files
    records_skipped: dict[str, int] = field(default_factory=dict)  # reason -> lines/rows
    files_truncated: int = 0  # damaged archives whose readable part was kept
    warnings: list[str] = field(default_factory=list)
    quiet: bool = False  # count without logging (a second pass over input already reported)
    strict: bool = False  # raise BadInputError instead of skipping
    encoding: str | None = None  # text files' encoding when they have no BOM (None: UTF-8)

    def skip_file(self, reason: str, message: str) -> None:
        if self.strict:
            raise BadInputError(f"{message} (--strict: stopping; leave out --strict to skip and count such input)")
        self.files_skipped[reason] = self.files_skipped.get(reason, 0) + 1
        self.warn(message)

    def skip_record(self, reason: str, message: str) -> None:
        if self.strict:
            raise BadInputError(f"{message} (--strict: stopping; leave out --strict to skip and count such input)")
        self.records_skipped[reason] = self.records_skipped.get(reason, 0) + 1
        self.warn(message)

    def warn(self, message: str) -> None:
        if not self.quiet:
            log.warning(message)
        if len(self.warnings) < MAX_KEPT_WARNINGS:
            self.warnings.append(message)

    def merge(self, other: ReadStats) -> None:
        """Add `other`'s counts into this one (for stats gathered in worker processes)."""
        for name in ("files_read", "documents", "input_bytes", "undecodable_sequences",
                     "documents_with_undecodable", "files_truncated"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("files_skipped", "records_skipped"):
            mine = getattr(self, name)
            for k, v in getattr(other, name).items():
                mine[k] = mine.get(k, 0) + v
        self.warnings.extend(other.warnings[: max(0, MAX_KEPT_WARNINGS - len(self.warnings))])

    def to_dict(self) -> dict[str, Any]:
        return {
            "files_read": self.files_read,
            "documents": self.documents,
            "input_bytes": self.input_bytes,
            "undecodable_sequences": self.undecodable_sequences,
            "documents_with_undecodable": self.documents_with_undecodable,
            "files_skipped": dict(self.files_skipped),
            "records_skipped": dict(self.records_skipped),
            "files_truncated": self.files_truncated,
        }


class BadInputError(InputError):
    """Bad input under `strict` reading: the message names the file (and line)."""


class BadFileError(Exception):
    """A file that cannot be read as a whole (binary, unreadable archive, malformed Parquet)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


# --------------------------------------------------------------------------------------------
# Decoding with a count of replaced bytes
# --------------------------------------------------------------------------------------------


class _ReplaceCounter:
    """A codecs error handler that replaces invalid UTF-8 with U+FFFD and counts occurrences.

    A registered handler is process-global, so the count is read as a difference around each
    decode call (the readers are single-threaded generators).
    """

    name = "gptforge-replace-count"

    def __init__(self) -> None:
        self.count = 0
        codecs.register_error(self.name, self)

    def __call__(self, exc: UnicodeError) -> tuple[str, int]:
        if not isinstance(exc, UnicodeDecodeError):
            raise exc
        self.count += 1
        return "\ufffd", exc.end


_REPLACE = _ReplaceCounter()


def decode_utf8(data: bytes) -> tuple[str, int]:
    """Decode UTF-8, replacing each invalid sequence with U+FFFD.

    Returns (text, number of invalid sequences replaced).
    """
    before = _REPLACE.count
    text = data.decode("utf-8", errors=_REPLACE.name)
    return text, _REPLACE.count - before


def sniff_binary(head: bytes) -> str | None:
    """Why `head` (a file's first bytes) looks binary, or None when it looks like text.

    Binary: a NUL byte anywhere (no text format we read contains one), or more than
    `BINARY_INVALID_FRACTION` of the bytes inside invalid UTF-8 sequences.
    """
    if b"\x00" in head:
        return "contains NUL bytes"
    if not head:
        return None
    decoder = codecs.getincrementaldecoder("utf-8")(errors=_REPLACE.name)
    before = _REPLACE.count
    decoder.decode(head, final=False)  # a multi-byte character cut at the end is not an error
    invalid = _REPLACE.count - before
    if invalid / len(head) > BINARY_INVALID_FRACTION:
        return f"{invalid} invalid UTF-8 sequences in its first {len(head)} bytes"
    return None


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

    Folders are walked recursively for files whose extension (after `.gz`/`.zst`) is one of
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
        hf = _hf_dataset_folder(root, names)
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


class _TruncatedArchive(Exception):
    pass


class _DecompressRaw(io.RawIOBase):
    """Streaming decompression (gzip or zstd) that keeps everything before a damaged spot.

    Compressed bytes are fed in 256 KiB chunks to a decompress object; the output is served as
    it comes, so a truncated archive yields all the text before the cut and then raises
    `_TruncatedArchive`. Each member/frame must reach its end marker (zstandard's own
    `stream_reader` ends quietly at a cut-off frame, which would pass a half-written archive
    off as complete). Concatenated members/frames (`cat a.gz b.gz`) are read in turn.
    """

    def __init__(self, path: Path, kind: str, fileobj: BinaryIO | None = None):
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

    def readable(self) -> bool:
        return True

    def _feed(self, chunk: bytes) -> None:
        while chunk:
            try:
                out = self._dobj.decompress(chunk)
            except self._errors as e:
                raise _TruncatedArchive(f"{self._path}: damaged {self._kind} archive ({e})") from e
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

    def readinto(self, b) -> int:  # type: ignore[override]
        while self._pos == len(self._buf) and not self._done:
            chunk = self._fh.read(256 * 1024)
            if not chunk:
                self._done = True
                if self._fed:
                    raise _TruncatedArchive(f"{self._path}: truncated {self._kind} archive "
                                            f"(it ends before its end-of-stream marker)")
                break
            self._feed(chunk)
        n = min(len(b), len(self._buf) - self._pos)
        b[:n] = self._buf[self._pos:self._pos + n]
        self._pos += n
        if self._pos == len(self._buf):
            self._buf, self._pos = b"", 0
        return n

    def close(self) -> None:
        try:
            self._fh.close()
        finally:
            super().close()


def open_binary(path: Path) -> BinaryIO:
    """Open `path` for reading bytes, decompressing `.gz`/`.zst` on the fly (streaming).

    Reading a damaged or truncated archive raises `_TruncatedArchive` at the damage.
    """
    comp = split_suffixes(path)[1]
    if comp not in COMPRESSION_EXTS:
        return open(path, "rb")
    raw = _DecompressRaw(path, comp)
    return io.BufferedReader(raw, buffer_size=1 << 20)  # type: ignore[return-value]


def source_size(path: str | Path) -> int:
    """Bytes of an input as stored (0 for a `hf:` dataset name or a file that vanished)."""
    if str(path).startswith(HF_PREFIX):
        return 0
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def read_file(path: Path, stats: ReadStats, text_field: str = "text",
              doc_separator: str | None = None) -> Iterator[Document]:
    """Yield the documents of one file, skipping and counting what cannot be read.

    A truncated/damaged `.gz`/`.zst` archive keeps every complete document read before the
    damage, drops the rest of the file (including a partly read document), warns and counts
    `files_truncated`. A binary or unreadable file yields nothing and is counted in
    `stats.files_skipped`.
    """
    ext, comp = split_suffixes(path)
    try:
        if str(path).startswith(HF_PREFIX):
            yield from _read_hf(str(path), stats, text_field)
        else:
            stats.input_bytes += path.stat().st_size
            yield from _read_format(path, ext, stats, text_field, doc_separator)
        stats.files_read += 1
    except BadFileError as e:
        stats.skip_file(e.reason, f"skipping {e}")
    except _TruncatedArchive as e:
        if stats.strict:
            raise BadInputError(f"{e} (--strict: stopping)") from e
        stats.files_truncated += 1
        stats.files_read += 1
        stats.warn(f"{e}: kept the complete documents read before the damage, skipped the rest")
    except OSError as e:
        stats.skip_file("unreadable", f"skipping {path}: cannot read it ({e})")


def _read_format(path: Path, ext: str, stats: ReadStats, text_field: str, doc_separator: str | None,
                 opener=None) -> Iterator[Document]:
    """Dispatch on the format extension; `opener()` gives the (decompressed) bytes when `path`
    is not a real file (a tar member). Text formats (.txt, .md, .jsonl, .json, .csv, unknown
    extensions) with a UTF-16/32 BOM, or in `stats.encoding`, are read as UTF-8 re-encoded."""
    if ext not in PARQUET_EXTS and ext not in ARROW_EXTS and ext not in TAR_EXTS:
        opener = _transcoding_opener(path, stats, opener)
    if ext in PARQUET_EXTS:
        yield from _read_parquet(path, stats, text_field, opener)
    elif ext in ARROW_EXTS:
        yield from _read_arrow(path, stats, text_field, opener)
    elif ext in JSON_EXTS:
        yield from _read_json(path, stats, text_field, opener)
    elif ext in CSV_EXTS:
        yield from _read_csv(path, stats, text_field, opener)
    elif ext in TAR_EXTS:
        with (opener() if opener else open_binary(path)) as fh:
            yield from _read_tar(path, fh, stats, text_field, doc_separator)
    else:
        yield from _read_text(path, stats, doc_separator, opener)


def _sniff_stream(fh: BinaryIO, path: Path) -> bytes:
    head = fh.read(SNIFF_BYTES)
    why = sniff_binary(head)
    if why:
        raise BadFileError("binary", f"{path}: binary file ({why}; if it is text in another encoding "
                                     f"without a byte-order mark, say which with --encoding, e.g. utf-16-le)")
    return head


#: byte-order marks that name an encoding, longest first (UTF-32 LE's starts like UTF-16 LE's).
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


class _Utf8Transcoder(io.RawIOBase):
    """A binary stream of UTF-8 re-encoded from `fh` read as `encoding` (invalid input -> U+FFFD)."""

    def __init__(self, fh: BinaryIO, encoding: str):
        self._fh = fh
        self._decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
        self._buf = memoryview(b"")
        self._eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        while not self._buf and not self._eof:
            chunk = self._fh.read(1 << 20)
            self._eof = not chunk
            self._buf = memoryview(self._decoder.decode(chunk, final=self._eof).encode("utf-8", "surrogatepass"))
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n

    def close(self) -> None:
        try:
            self._fh.close()
        finally:
            super().close()


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


class _PrefixedOwner(io.RawIOBase):
    """`head` then the rest of `fh`; closing it closes `fh` (for a peeked one-shot stream)."""

    def __init__(self, head: bytes, fh: BinaryIO):
        self._head = memoryview(head)
        self._fh = fh

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        if self._head.nbytes:
            n = min(len(b), self._head.nbytes)
            b[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        data = self._fh.read(len(b))
        b[:len(data)] = data
        return len(data)

    def close(self) -> None:
        try:
            self._fh.close()
        finally:
            super().close()


def _transcoding_opener(path: Path, stats: ReadStats, opener=None):
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
    stream: io.RawIOBase = _PrefixedOwner(head, fh)
    if enc is not None:
        stream = _Utf8Transcoder(io.BufferedReader(stream), enc)  # type: ignore[arg-type]
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
    from gptforge.errors import InputError, MissingInputError

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
    opener = _transcoding_opener(path, stats) or (lambda: open_binary(path))
    with opener() as fh:
        try:
            head = _sniff_stream(fh, path)
        except BadFileError as e:
            raise InputError(f"{e}; not scored as text") from e
        data = head + fh.read()
    text, _ = decode_utf8(data)
    return text[1:] if text.startswith("\ufeff") else text


def _read_text(path: Path, stats: ReadStats, doc_separator: str | None = None, opener=None) -> Iterator[Document]:
    if doc_separator:
        yield from _read_text_separated(path, stats, doc_separator, opener)
        return
    with (opener() if opener else open_binary(path)) as fh:
        head = _sniff_stream(fh, path)
        data = head + fh.read()
    text, bad = decode_utf8(data)
    if bad:
        stats.undecodable_sequences += bad
        stats.documents_with_undecodable += 1
    stats.documents += 1
    yield {"id": str(path), "text": text, "meta": {"source": str(path)}}


def _read_text_separated(path: Path, stats: ReadStats, separator: str, opener=None) -> Iterator[Document]:
    """Documents of a text file cut at `separator` (streamed: the file is never held whole).

    Ids are `PATH@N`, N the 0-based piece number counting empty pieces too, so an id does not
    change when another piece becomes empty.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors=_REPLACE.name)
    with (opener() if opener else open_binary(path)) as fh:
        chunk = _sniff_stream(fh, path)
        rest = ""
        piece = 0
        while True:
            before = _REPLACE.count
            final = not chunk
            rest += decoder.decode(chunk, final=final)
            bad = _REPLACE.count - before
            if bad:  # attributed to the piece being read; close enough for a count
                stats.undecodable_sequences += bad
                stats.documents_with_undecodable += 1
            parts = rest.split(separator)
            rest = parts.pop() if not final else ""
            for text in parts:
                if text.strip():
                    stats.documents += 1
                    yield {"id": f"{path}@{piece}", "text": text, "meta": {"source": str(path)}}
                piece += 1
            if final:
                break
            chunk = fh.read(4 << 20)


def _text_of(record: Any, text_field: str, where: str, stats: ReadStats) -> str | None:
    if not isinstance(record, dict):
        stats.skip_record("not_an_object", f"{where}: skipping a JSON {type(record).__name__}, "
                          f"expected an object with a {text_field!r} field")
        return None
    name = resolve_text_field(text_field, record)
    if name is None:
        keys = ", ".join(list(record)[:8])
        stats.skip_record("missing_field", f"{where}: skipping a record without the text field "
                          f"{_field_label(text_field)} (its fields: {keys}); choose the field with --text-field")
        return None
    text = record[name]
    if not isinstance(text, str):
        stats.skip_record("field_not_string", f"{where}: skipping a record whose {text_field!r} is "
                          f"a {type(text).__name__}, not a string")
        return None
    return text


def _meta_of(record: dict, text_field: str, source: str) -> dict[str, Any]:
    name = resolve_text_field(text_field, record)
    meta = {k: v for k, v in record.items() if k != name and isinstance(v, (str, int, float, bool))}
    meta["source"] = source
    return meta


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
                stats.skip_record("bad_json", f"{where}: skipping a line that is not valid JSON ({e.msg} "
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


class _Prefixed(io.RawIOBase):
    """A raw stream that first returns `head` (already sniffed) then the rest of `fh`."""

    def __init__(self, head: bytes, fh: BinaryIO):
        self._head = memoryview(head)
        self._fh = fh

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
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
        raise BadFileError("bad_json", f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from e
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


class _PushbackLines:
    """An iterator of physical lines that counts them and can give back the last record's tail."""

    def __init__(self, it: Iterator[str]):
        self.it = it
        self.pending: list[str] = []  # lines to read again, next one last
        self.line = 0  # physical lines handed out (1-based number of the last one)
        self.taken: list[str] = []  # lines of the record being parsed

    def __iter__(self) -> _PushbackLines:
        return self

    def __next__(self) -> str:
        line = self.pending.pop() if self.pending else next(self.it)
        self.line += 1
        self.taken.append(line)
        return line

    def give_back(self, lines: list[str]) -> None:
        self.pending.extend(reversed(lines))
        self.line -= len(lines)


def _read_csv(path: Path, stats: ReadStats, text_field: str, opener=None) -> Iterator[Document]:
    """One document per CSV row (header row first); ids `PATH#ROW`, ROW 0-based after the header.

    Parsed strictly (`csv` with strict=True): a row that does not parse, or whose cell count is
    not the header's, is skipped and counted with its `FILE:LINE` (physical line, header = 1).
    A malformed row that ran over several lines (an unclosed quote swallows the lines after it)
    gives those lines back, so only the broken line is lost, not the rows behind it. Blank lines
    are not rows.
    """
    import csv
    import sys

    csv.field_size_limit(sys.maxsize)  # real corpora hold whole articles in one cell
    with (opener() if opener else open_binary(path)) as fh:
        head = _sniff_stream(fh, path)
        text = io.TextIOWrapper(io.BufferedReader(_Prefixed(head, fh)), encoding="utf-8",
                                errors=_REPLACE.name, newline="")
        lines = _PushbackLines(iter(text))
        reader = csv.reader(lines, strict=True)
        try:
            header = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise BadFileError("bad_csv", f"{path}:1: not a readable CSV header ({e})") from e
        name = resolve_text_field(text_field, header)
        if name is None:
            raise BadFileError("missing_field", f"{path}: no column {_field_label(text_field)} (columns: "
                               f"{', '.join(header[:12])}); choose the column with --text-field")
        col = header.index(name)
        row = -1
        while True:
            lines.taken = []
            start = lines.line + 1
            try:
                values = next(reader)
            except StopIteration:
                break
            except csv.Error as e:
                problem = f"does not parse ({e})"
            else:
                if not values:  # a blank line
                    continue
                problem = (None if len(values) == len(header) else
                           f"has {len(values)} cells, the header {len(header)}")
            row += 1
            if problem is None:
                stats.documents += 1
                meta = {h: v for h, v in zip(header, values) if h != name}
                meta["source"] = str(path)
                yield {"id": f"{path}#{row}", "text": values[col], "meta": meta}
                continue
            span = f" (a record over lines {start}-{lines.line}: an unclosed quote?)" if len(lines.taken) > 1 else ""
            stats.skip_record("bad_csv", f"{path}:{start}: skipping a malformed CSV row: it {problem}{span}")
            if len(lines.taken) > 1:
                lines.give_back(lines.taken[1:])
                reader = csv.reader(lines, strict=True)


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


def _read_tar(path: Path, fh: BinaryIO, stats: ReadStats, text_field: str,
              doc_separator: str | None) -> Iterator[Document]:
    """Members of a tar archive read as files of their own (ids `ARCHIVE/MEMBER...`), streamed.

    Compressed members are decompressed; a member that is itself a tar archive (OpenWebText:
    `.xz` files holding tars of `.txt`) is read recursively. A member without a known extension
    is read as text. A cut compressed archive is detected and counted (`files_truncated`), but
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
                yield from _read_tar(name, body, stats, text_field, doc_separator)  # type: ignore[arg-type]
                continue
            opened = [False]

            def opener(b=body):
                if opened[0]:
                    raise BadFileError("unreadable", f"{name}: a tar member can be read once")
                opened[0] = True
                return b
            yield from _read_format(name, ext, stats, text_field, doc_separator, opener)
    except tarfile.TarError as e:
        raise _TruncatedArchive(f"{path}: damaged tar archive ({e})") from e


def _read_hf(spec: str, stats: ReadStats, text_field: str) -> Iterator[Document]:
    """`hf:NAME[:CONFIG]`: the train split of a Hugging Face dataset, streamed with `datasets`.

    Ids are `hf:NAME[:CONFIG]#ROW`. Needs network access to the Hub (or its cache).
    """
    try:
        import datasets
    except ImportError as e:
        raise BadFileError("unreadable", f"{spec}: reading Hugging Face datasets needs the datasets package "
                           f"(pip install 'gptforge[hf]'); local save_to_disk folders and .arrow files "
                           f"read without it") from e
    name, _, config = spec[len(HF_PREFIX):].partition(":")
    try:
        ds = datasets.load_dataset(name, config or None, split="train", streaming=True)
    except Exception as e:  # the Hub client raises many types; all mean "cannot open it"
        raise BadFileError("unreadable", f"{spec}: cannot open the dataset ({type(e).__name__}: {e})") from e
    for row, record in enumerate(ds):
        t = _text_of(record, text_field, f"{spec}#{row}", stats)
        if t is None:
            continue
        stats.documents += 1
        yield {"id": f"{spec}#{row}", "text": t, "meta": _meta_of(record, text_field, spec)}


def _hf_dataset_folder(root: str, names: list[str]) -> list[Path] | None:
    """The .arrow files of a Hugging Face `save_to_disk` folder (state.json order), else None."""
    if "state.json" not in names or "dataset_info.json" not in names:
        return None
    try:
        with open(os.path.join(root, "state.json"), encoding="utf-8") as f:
            state = json.load(f)
        files = [d["filename"] for d in state.get("_data_files", [])]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        files = []
    if not files:
        files = sorted(n for n in names if n.endswith(".arrow"))
    return [Path(os.path.normpath(os.path.join(root, f))) for f in files]


def read_documents(inputs: Iterable[str | Path], stats: ReadStats | None = None,
                   text_field: str = "text", files: list[Path] | None = None,
                   doc_separator: str | None = None) -> Iterator[Document]:
    """Stream the documents of every input (files, folders, globs), file by file in sorted order.

    Args:
        inputs: paths, folders or glob patterns.
        stats: counters to fill (a fresh one when None).
        text_field: JSON field / Parquet column holding the text.
        files: an already expanded file list (skips `expand_inputs`).

    Raises:
        FileNotFoundError: an input does not exist (raised before any document is yielded).
    """
    stats = stats if stats is not None else ReadStats()
    for path in files if files is not None else expand_inputs(inputs):
        yield from read_file(path, stats, text_field, doc_separator)
