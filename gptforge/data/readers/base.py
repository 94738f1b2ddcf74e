"""What every reader shares: `Document`, the `Reader` interface and its registry, read counters,
skip/refuse exceptions, UTF-8 decoding with a count of replacements, binary sniffing, record
fields, and the byte-stream wrappers.
"""

from __future__ import annotations

import codecs
import io
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

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


def field_label(text_field: str) -> str:
    """`text_field` as messages name it ("any of text, story, ..." for auto)."""
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



@dataclass
class Document:
    """One document, as readers yield it and every curation step takes and returns it.

    `id`: stable and unique within a reading: the input path (as given, normalized) plus
    `:LINE` (JSON lines, 1-based), `#ROW` (Parquet, CSV, Arrow rows and JSON array items,
    0-based), `@N` (pieces cut by a separator) or `/MEMBER` (tar members). `source`: the file (or
    `hf:` dataset) it came from. `metadata`: the record's other scalar fields and what steps add
    (`language_score`, `blocklist`). `language`: the ISO 639 code a language-ID step found.
    """

    text: str
    id: str
    source: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    language: str | None = None


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
    #: field or column -> documents read from it (records: JSON lines, Parquet, CSV, Arrow, hf:);
    #: with --text-field auto, which of AUTO_TEXT_FIELDS each input had. Not in `to_dict`: it
    #: travels in a curate shard's result as its own "text_fields" entry.
    text_fields: dict[str, int] = field(default_factory=dict)

    def count_field(self, name: str, n: int = 1) -> None:
        """Count `n` documents read from the record field or column `name`."""
        self.text_fields[name] = self.text_fields.get(name, 0) + n

    def fields_line(self, text_field: str) -> str:
        """`text_fields` as the prepare summary says it, most documents first:
        `'content': 12 documents, 'text': 3 documents` plus, under `text_field` "auto", the rule."""
        counts = sorted(self.text_fields.items(), key=lambda kv: -kv[1])
        auto = f" (--text-field auto: the first present of {', '.join(AUTO_TEXT_FIELDS)})" if text_field == "auto" else ""
        return ", ".join(f"{k!r}: {v:,} documents" for k, v in counts) + auto

    def count_undecodable(self, replaced: int) -> None:
        """Count `replaced` invalid UTF-8 sequences (U+FFFD now) in one document, if any."""
        if replaced:
            self.undecodable_sequences += replaced
            self.documents_with_undecodable += 1

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
        for name in ("files_skipped", "records_skipped", "text_fields"):
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


#: the process's counting error handler: `errors=REPLACE_COUNTER.name`, count `REPLACE_COUNTER.count`.
REPLACE_COUNTER = _ReplaceCounter()


def decode_utf8(data: bytes) -> tuple[str, int]:
    """Decode UTF-8, replacing each invalid sequence with U+FFFD.

    Returns (text, number of invalid sequences replaced).
    """
    before = REPLACE_COUNTER.count
    text = data.decode("utf-8", errors=REPLACE_COUNTER.name)
    return text, REPLACE_COUNTER.count - before


def sniff_binary(head: bytes) -> str | None:
    """Why `head` (a file's first bytes) looks binary, or None when it looks like text.

    Binary: a NUL byte anywhere (no text format we read contains one), or more than
    `BINARY_INVALID_FRACTION` of the bytes inside invalid UTF-8 sequences.
    """
    if b"\x00" in head:
        return "contains NUL bytes"
    if not head:
        return None
    decoder = codecs.getincrementaldecoder("utf-8")(errors=REPLACE_COUNTER.name)
    before = REPLACE_COUNTER.count
    decoder.decode(head, final=False)  # a multi-byte character cut at the end is not an error
    invalid = REPLACE_COUNTER.count - before
    if invalid / len(head) > BINARY_INVALID_FRACTION:
        return f"{invalid} invalid UTF-8 sequences in its first {len(head)} bytes"
    return None


def sniff_stream(fh: BinaryIO, path: Path) -> bytes:
    """The first `SNIFF_BYTES` of `fh`, refused with `BadFileError` ("binary") when they look binary."""
    head = fh.read(SNIFF_BYTES)
    why = sniff_binary(head)
    if why:
        raise BadFileError("binary", f"{path}: binary file ({why}; if it is text in another encoding "
                                     f"without a byte-order mark, say which with --encoding, e.g. utf-16-le)")
    return head


def text_of(record: Any, text_field: str, where: str, stats: ReadStats) -> str | None:
    """A record's text, or None (skipped and counted in `stats`) when it has none."""
    if not isinstance(record, dict):
        stats.skip_record("not_an_object", f"{where}: skipping a JSON {type(record).__name__}, "
                          f"expected an object with a {text_field!r} field")
        return None
    name = resolve_text_field(text_field, record)
    if name is None:
        keys = ", ".join(list(record)[:8])
        stats.skip_record("missing_field", f"{where}: skipping a record without the text field "
                          f"{field_label(text_field)} (its fields: {keys}); choose the field with --text-field")
        return None
    text = record[name]
    if not isinstance(text, str):
        stats.skip_record("field_not_string", f"{where}: skipping a record whose {text_field!r} is "
                          f"a {type(text).__name__}, not a string")
        return None
    stats.count_field(name)
    return text


def metadata_of(record: dict, text_field: str) -> dict[str, Any]:
    """A record's scalar fields other than its text, as a document's metadata."""
    name = resolve_text_field(text_field, record)
    return {k: v for k, v in record.items() if k != name and isinstance(v, (str, int, float, bool))}


def column_documents(path: Path, values: list[Any], first_row: int, column: str, stats: ReadStats,
                     reason: str) -> Iterator[Document]:
    """Documents `PATH#ROW` of one column's values (a Parquet row group, an Arrow batch), rows
    numbered from `first_row`; a value that is not a string is skipped and counted under `reason`."""
    for k, value in enumerate(values):
        row = first_row + k
        if not isinstance(value, str):
            what = "null" if value is None else type(value).__name__
            stats.skip_record(reason, f"{path}#{row}: skipping a row whose {column!r} is {what}")
            continue
        stats.documents += 1
        stats.count_field(column)
        yield Document(value, f"{path}#{row}", str(path))


# --------------------------------------------------------------------------------------------
# Byte streams
# --------------------------------------------------------------------------------------------


class RawWrapper(io.RawIOBase):
    """What the readers' byte streams share: readable, and closing one closes the file object
    it reads (`self._fh`, set by the subclass's __init__) unless the subclass sets `_owns` False.
    Subclasses define `readinto`."""

    _owns = True

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        try:
            fh = getattr(self, "_fh", None)  # None when __init__ failed before opening it
            if self._owns and fh is not None:
                fh.close()
        finally:
            super().close()


class Prefixed(RawWrapper):
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


# --------------------------------------------------------------------------------------------
# The reader interface
# --------------------------------------------------------------------------------------------

#: opens the (decompressed, UTF-8) bytes of a file that is not on disk as such (a tar member).
Opener = Callable[[], BinaryIO]


@dataclass(frozen=True)
class ReadOptions:
    """What a reader is told besides the file: the record field or column with the text, and the
    string that cuts a text file into documents."""

    text_field: str = "text"
    doc_separator: str | None = None


class Reader:
    """One input format. A subclass names its `extensions` (after a compression suffix), may
    recognize its files by their first bytes (`sniff`, for names without a known extension),
    says whether its bytes are text to re-encode as UTF-8 first (`transcode`: UTF-16/32 with a
    byte-order mark, `--encoding`), and yields the file's documents from `read`, counting into
    `stats` and raising `BadFileError` for a file it cannot read at all. Defining a subclass
    registers it in `READERS` (`registered=False` leaves it out: a reader chosen otherwise, such
    as `hf:` names), which `readers.dispatch` chooses from.
    """

    extensions: ClassVar[frozenset[str]] = frozenset()
    transcode: ClassVar[bool] = True

    def __init__(self, dispatch: Callable[..., Iterator[Document]] | None = None):
        #: what reads the members of a container format (`dispatch.read_format`; tar archives).
        self.dispatch = dispatch

    def __init_subclass__(cls, registered: bool = True, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if registered:
            READERS.append(cls)

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        """Whether `head` (a file's first bytes, up to 512) is this format's."""
        return False

    def read(self, path: Path, stats: ReadStats, options: ReadOptions, opener: Opener | None = None) -> Iterator[Document]:
        raise NotImplementedError(f"{type(self).__name__}.read")


#: every registered reader class, in definition order (`Reader.__init_subclass__`).
READERS: list[type[Reader]] = []
