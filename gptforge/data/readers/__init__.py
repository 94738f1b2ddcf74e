"""Stream `Document`s (text, id, source, metadata, language) out of files, folders and globs.

Formats (one `Reader` class each, chosen by file name, compression suffix first; a name without a
known extension by its first bytes (`Reader.sniff`: Parquet, Arrow, tar), else read as text):

- `.txt`, `.md` (and any explicitly named file of another extension): one document per file, or
  one per piece between `doc_separator`s; a big uncompressed one with a separator can be read in
  byte ranges (`plan_text_ranges`, `read_file_range`) with the same documents and ids.
- `.jsonl`, `.json`: one document per JSON line, text in `text_field`; a `.json` file holding a
  JSON array (or one object) is read whole.
- `.parquet`: one document per row, text in the `text_field` column, read row group by row group.
- `.csv`: one document per row after the header row, text in the `text_field` column, the other
  cells its metadata.
- `.arrow`: one document per row of an Arrow IPC file or stream (Hugging Face `save_to_disk`
  folders and datasets' cache files).
- `.tar`: every member read by the reader of its own extension (a member that is a tar itself,
  recursively).
- `hf:NAME[:CONFIG]`: a Hugging Face dataset from the local cache (needs the datasets package).
- Any file above compressed as `.gz`, `.zst`, `.bz2` or `.xz` (`.parquet.gz` and `.arrow.gz` are
  decompressed to a temporary file first, since they need random access).

Document ids are stable: the input path (as given, normalized with `os.path.normpath`) plus
`:LINE` (1-based, JSON lines), `#ROW` (0-based, Parquet, CSV and Arrow rows and JSON array items),
`/MEMBER` (tar members), or nothing (one document per file). They do not depend on reading order, so a split decided by hashing them
is reproducible.

Bad input never stops a run of many files: a binary file, a truncated archive, a malformed JSON
line, a missing text field or an unreadable Parquet file is skipped with a warning naming the file
(and line) and counted in `ReadStats`. A path that does not exist is an error (`FileNotFoundError`)
before anything is read: it is almost always a typo.

One module per format (text, jsonl, parquet, csv, arrow, tar, hf), each a `Reader` subclass
registered by subclassing `base.Reader`, beside the shared pieces, all public (base: `Document`, the
`Reader` interface and registry, counters, errors, decoding, record fields, byte streams; files:
inputs, decompression, local copies; encoding: byte-order marks); no reader module imports
another's private names. `dispatch` picks the reader for a file (`reader_for`). This package's
namespace re-exports the public names.
"""

from gptforge.data.readers.base import (
    ARROW_EXTS,
    AUTO_TEXT_FIELDS,
    BINARY_INVALID_FRACTION,
    COMPRESSION_EXTS,
    CSV_EXTS,
    HF_PREFIX,
    JSON_EXTS,
    MAX_KEPT_WARNINGS,
    PARQUET_EXTS,
    READERS,
    SNIFF_BYTES,
    SUPPORTED_EXTS,
    TAR_EXTS,
    TEXT_EXTS,
    BadFileError,
    BadInputError,
    Document,
    Reader,
    ReadOptions,
    ReadStats,
    decode_utf8,
    resolve_text_field,
    sniff_binary,
)
from gptforge.data.readers.dispatch import (
    plan_text_ranges,
    read_documents,
    read_file,
    read_file_range,
    read_format,
    reader_for,
)
from gptforge.data.readers.encoding import BOMS, bom_encoding, read_text_file, text_encoding_of
from gptforge.data.readers.files import expand_inputs, open_binary, source_size, split_suffixes
from gptforge.data.readers.jsonl import ext_is_json

__all__ = ["ARROW_EXTS", "AUTO_TEXT_FIELDS", "BINARY_INVALID_FRACTION", "BOMS", "BadFileError", "BadInputError", "COMPRESSION_EXTS", "CSV_EXTS", "Document", "HF_PREFIX", "JSON_EXTS", "MAX_KEPT_WARNINGS", "PARQUET_EXTS", "READERS", "ReadOptions", "ReadStats", "Reader", "read_format", "reader_for", "SNIFF_BYTES", "SUPPORTED_EXTS", "TAR_EXTS", "TEXT_EXTS", "bom_encoding", "decode_utf8", "expand_inputs", "ext_is_json", "open_binary", "plan_text_ranges", "read_documents", "read_file", "read_file_range", "read_text_file", "resolve_text_field", "sniff_binary", "source_size", "split_suffixes", "text_encoding_of"]
