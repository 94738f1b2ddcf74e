"""The token shard folder that `prepare` writes and the trainer reads.

Layout (format "gptforge-shards", version 1)::

    DIR/meta.json         description below
    DIR/tokenizer.json    Hugging Face tokenizers format (the tokenizer that made the ids)
    DIR/train_000.bin     raw little-endian token ids (dtype in meta), every document followed
    DIR/train_001.bin     by the EOS id; a new file starts once a file passes the size limit
    DIR/val_000.bin       (files only end at document boundaries)
    DIR/test_000.bin

meta.json::

    {"format": "gptforge-shards", "format_version": 1,
     "tokenizer_sha256": hex, "vocab_size": int, "dtype": "uint16" | "uint32", "eos_id": int,
     "splits": {"train": {"tokens": int, "documents": int, "bytes": int, "files": [...]}, ...},
     "file_sha256": {"train_000.bin": hex, ...},
     "prepare_config": {...}, "gptforge_version": str}

`tokens` counts EOS ids too; `bytes` is the UTF-8 size of the documents' normalized text (the
denominator of bits per byte). `file_sha256` is each .bin file's SHA-256 (checked when a run
starts and by `gptforge prepare --verify`: `gptforge.data.shard_verify`; folders written before it
existed have none and are not checked). A split with no documents has `"files": []`: empty files are not
written because an empty file cannot be memory-mapped.

`prepare` records in `prepare_config` its options and recipe and, among others, `val_languages`
(per langid label of the val split, "und" without one: documents, characters, bytes, tokens,
bytes_per_token, characters_per_token; EOS not counted) and, with a dedup step, `near_dedup` (the
shingle unit, n, LSH bands and rows, and the similarity threshold in force).

The folder is written under a temporary name beside DIR and renamed into place when complete
(meta.json written last inside it), so a killed `prepare` never leaves a DIR that looks valid.
Like nanoGPT's `train.bin` and Megatron's `.bin`, the shards read with `numpy.memmap` alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gptforge.atomic import atomic_write_json, fsync_dir
from gptforge.data.tokenizer import Tokenizer

FORMAT = "gptforge-shards"
FORMAT_VERSION = 1
SPLITS = ("train", "val", "test")
#: default size at which a new shard file is started (bytes).
DEFAULT_MAX_SHARD_BYTES = 1 << 30


_RAW_SUFFIXES = frozenset({".txt", ".md", ".jsonl", ".json", ".csv", ".parquet", ".gz", ".zst", ".bz2", ".xz", ".py"})
"""File endings of corpus files `prepare` reads: a folder of them given as shards gets the right advice."""

def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """Little-endian uint16 when every id fits (vocab_size <= 65536), else uint32."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


class ShardWriter:
    """Writes a shard folder; use as a context manager (an exception discards the partial output).

    Example::

        with ShardWriter(out, tokenizer) as w:
            w.write("train", ids, documents=3, nbytes=1234)   # ids: 1-D array, EOS included
            meta = w.finish(prepare_config={...})

    Args:
        out_dir: the folder to create. It must not exist (or be empty) unless `overwrite`.
        tokenizer: the tokenizer that made the ids (copied into the folder, hashed into meta).
        max_shard_bytes: a file is closed and the next one started at the first document end
            (EOS id) at or past this many bytes, so files end at document boundaries.
        overwrite: replace an existing shard folder (only once the new one is complete).

    Raises:
        FileExistsError: `out_dir` exists, is not empty and `overwrite` is False.
    """

    def __init__(self, out_dir: str | Path, tokenizer: Tokenizer, *,
                 max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, overwrite: bool = False):
        self.out_dir = Path(out_dir)
        check_output_dir(self.out_dir, overwrite)
        self.overwrite = overwrite
        self.tokenizer = tokenizer
        self.dtype = dtype_for_vocab(tokenizer.vocab_size)
        self.max_shard_bytes = int(max_shard_bytes)
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        self.tmp_dir = self.out_dir.parent / f".{self.out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.tmp_dir.mkdir()
        self.splits: dict[str, dict[str, Any]] = {
            s: {"tokens": 0, "documents": 0, "bytes": 0, "files": []} for s in SPLITS}
        self._fh: dict[str, Any] = {}
        self._fh_bytes: dict[str, int] = {}
        self._sha: dict[str, Any] = {}  # file name -> hashlib.sha256 of what was written
        self._done = False

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._done:
            self.abort()

    def write(self, split: str, ids: np.ndarray, documents: int, nbytes: int) -> None:
        """Append token ids (1-D, EOS after each document already included) to `split`.

        The ids may end inside a document (the next call continues it); a file is closed only
        after an EOS, so every file ends at a document boundary.

        Args:
            ids: token ids; cast to the folder's dtype (values must be < vocab_size).
            documents: number of documents these ids hold.
            nbytes: UTF-8 bytes of those documents' text.
        """
        if split not in self.splits:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        ids = np.asarray(ids)
        if ids.size and int(ids.max()) >= self.tokenizer.vocab_size:
            raise ValueError(f"token id {int(ids.max())} >= vocab_size {self.tokenizer.vocab_size}")
        info = self.splits[split]
        data = ids.astype(self.dtype, copy=False)
        itemsize = self.dtype.itemsize
        while data.size:
            fh = self._fh.get(split)
            if fh is None:
                name = f"{split}_{len(info['files']):03d}.bin"
                fh = open(self.tmp_dir / name, "wb")
                self._fh[split], self._fh_bytes[split] = fh, 0
                info["files"].append(name)
                self._sha[name] = hashlib.sha256()
            # Fill the current file up to the limit, then finish the document in progress
            # (up to and including its EOS) so that every file ends at a document boundary.
            room = max(1, -(-(self.max_shard_bytes - self._fh_bytes[split]) // itemsize))
            take = data.size
            if data.size > room:
                ends = np.flatnonzero(data[room - 1:] == self.tokenizer.eos_id)
                if ends.size:
                    take = room - 1 + int(ends[0]) + 1
            chunk = data[:take].tobytes()
            fh.write(chunk)
            self._sha[info["files"][-1]].update(chunk)
            self._fh_bytes[split] += take * itemsize
            ends_document = int(data[take - 1]) == self.tokenizer.eos_id
            data = data[take:]
            # A call may end inside a document (a window of a big one): its file stays open.
            if self._fh_bytes[split] >= self.max_shard_bytes and ends_document:
                self._close(split)
        info["tokens"] += int(ids.size)
        info["documents"] += int(documents)
        info["bytes"] += int(nbytes)

    def _close(self, split: str) -> None:
        fh = self._fh.pop(split, None)
        if fh is not None:
            fh.flush()
            os.fsync(fh.fileno())
            fh.close()

    def finish(self, prepare_config: dict[str, Any] | None = None,
               before_move: Callable[[Path, dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Close the files, write tokenizer.json then meta.json, and move the folder into place.

        Args:
            before_move: called as `before_move(tmp_dir, meta)` once every file is complete and
                before the folder is renamed into place (to add files such as a report).

        Returns the meta dict written.
        """
        from gptforge import __version__

        for split in list(self._fh):
            self._close(split)
        self.tokenizer.save(self.tmp_dir / "tokenizer.json")
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "tokenizer_sha256": self.tokenizer.sha256,
            "vocab_size": self.tokenizer.vocab_size,
            "dtype": self.dtype.name,
            "eos_id": self.tokenizer.eos_id,
            "splits": self.splits,
            "file_sha256": {name: h.hexdigest() for name, h in self._sha.items()},
            "prepare_config": prepare_config or {},
            "gptforge_version": __version__,
        }
        atomic_write_json(self.tmp_dir / "meta.json", meta)
        if before_move is not None:
            before_move(self.tmp_dir, meta)
        fsync_dir(self.tmp_dir)
        self._move_into_place()
        self._done = True
        return meta

    def _move_into_place(self) -> None:
        old = None
        if self.out_dir.exists():
            if self.out_dir.is_dir() and not any(self.out_dir.iterdir()):
                self.out_dir.rmdir()
            elif self.overwrite:
                old = self.out_dir.parent / f".{self.out_dir.name}.old-{uuid.uuid4().hex[:8]}"
                os.rename(self.out_dir, old)
            else:
                raise FileExistsError(f"output folder {self.out_dir} appeared while writing; not replaced")
        os.rename(self.tmp_dir, self.out_dir)
        fsync_dir(self.out_dir.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def abort(self) -> None:
        """Discard everything written (the output folder is left as it was)."""
        for fh in self._fh.values():
            fh.close()
        self._fh.clear()
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        self._done = True


def written_by_prepare(out_dir: Path) -> bool:
    """Whether `out_dir` holds a meta.json that `gptforge prepare` writes (a shard folder, or a
    `--source` folder): the mark of a folder --overwrite may replace."""
    try:
        meta = json.loads((Path(out_dir) / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") in (FORMAT, "gptforge-mixture")


def check_output_dir(out_dir: Path, overwrite: bool) -> None:
    """Raise FileExistsError when `out_dir` holds something and `overwrite` is False, or holds
    something `gptforge prepare` did not write (`written_by_prepare`): --overwrite replaces only
    prepare's own output, never a folder of the user's files."""
    out_dir = Path(out_dir)
    if out_dir.exists():
        if not out_dir.is_dir():
            raise FileExistsError(f"output path {out_dir} exists and is not a folder")
        if any(out_dir.iterdir()) and not overwrite:
            raise FileExistsError(f"output folder {out_dir} exists and is not empty; "
                                  f"choose another --out or pass --overwrite")
        if overwrite and any(out_dir.iterdir()) and not written_by_prepare(out_dir):
            raise FileExistsError(f"output folder {out_dir} is not empty and was not written by gptforge prepare "
                                  f"(no meta.json of a shard folder in it); --overwrite replaces only prepare's "
                                  f"own output: choose another --out, or empty the folder yourself")


def load_meta(shard_dir: str | Path, verify_files: bool = True) -> dict[str, Any]:
    """Read and check a shard folder's meta.json (and, with `verify_files`, the files: `check_files`).

    Raises:
        FileNotFoundError: the folder or its meta.json is missing (e.g. prepare did not finish).
        ValueError: meta.json is not JSON, not a gptforge shard folder, or a format version
            this gptforge cannot read.
    """
    shard_dir = Path(shard_dir)
    if shard_dir.is_file():
        raise FileNotFoundError(f"{shard_dir} is a file, not a shard folder: prepare it into a new folder "
                                f"(`gptforge prepare {shard_dir} --out data/NAME`) and pass that folder")
    if not shard_dir.is_dir():
        raise FileNotFoundError(f"shard folder {shard_dir} does not exist; create it with `gptforge prepare`")
    path = shard_dir / "meta.json"
    if not path.is_file():
        if any(p.suffix in _RAW_SUFFIXES for p in shard_dir.iterdir() if p.is_file()):
            raise FileNotFoundError(f"{shard_dir} holds raw text, not shards: prepare it into a new folder "
                                    f"(`gptforge prepare {shard_dir} --out data/NAME`) and pass that folder")
        raise FileNotFoundError(f"{path} is missing: {shard_dir} is not a complete shard folder "
                                f"(run `gptforge prepare ... --out {shard_dir}`)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path}: not a gptforge shard folder (format {meta.get('format') if isinstance(meta, dict) else None!r}, "
                         f"expected {FORMAT!r})")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(f"{path}: shard format version {version!r} is not supported by this gptforge "
                         f"(reads version {FORMAT_VERSION}); re-run `gptforge prepare` or upgrade gptforge")
    for key in ("vocab_size", "dtype", "eos_id", "splits", "tokenizer_sha256"):
        if key not in meta:
            raise ValueError(f"{path}: missing field {key!r}")
    if meta["dtype"] not in ("uint16", "uint32"):
        raise ValueError(f"{path}: dtype {meta['dtype']!r} not supported (uint16 or uint32)")
    if verify_files:
        check_files(shard_dir, meta)
    return meta


#: bytes read from each end of every shard file to check its ids against the vocabulary.
SAMPLE_BYTES = 1 << 16


def check_files(shard_dir: str | Path, meta: dict[str, Any]) -> None:
    """Check meta.json's dtype and token counts against the .bin files, cheaply (stat + 128 KB a file).

    Per split: every listed file exists, its size is a multiple of the dtype's size, it ends
    with the EOS id (files end at document boundaries, so a truncated file rarely does), the
    first and last `SAMPLE_BYTES` hold only ids < vocab_size, and the files' bytes are exactly
    meta's token count times the dtype's size. A wrong dtype would otherwise be read as garbage
    ids and fail deep inside the model's embedding.

    Raises:
        MissingInputError: a listed file is missing.
        DamagedFileError: any other mismatch; the message gives the numbers (bytes, tokens,
            the dtype the sizes would fit) and what to do.
    """
    from gptforge.errors import DamagedFileError, MissingInputError

    shard_dir = Path(shard_dir)
    dtype = np.dtype("<u2" if meta["dtype"] == "uint16" else "<u4")
    other = np.dtype("<u4" if meta["dtype"] == "uint16" else "<u2")
    redo = f"re-run `gptforge prepare` for {shard_dir}"
    for split, info in meta["splits"].items():
        sizes = {}
        for name in info.get("files", []):
            path = shard_dir / name
            if not path.is_file():
                raise MissingInputError(f"shard file {path} listed in meta.json is missing; {redo}")
            sizes[path] = path.stat().st_size
        total = sum(sizes.values())
        expected = int(info.get("tokens", 0))
        if total != expected * dtype.itemsize:
            hint = ""
            if total == expected * other.itemsize:
                hint = f"; the sizes fit {expected:,} tokens of {other.name}: meta.json's dtype is wrong"
            raise DamagedFileError(
                f"{shard_dir}: split {split!r}: the files ({', '.join(p.name for p in sizes)}) hold {total:,} bytes "
                f"= {total / dtype.itemsize:,.1f} tokens of {meta['dtype']}, but meta.json says {expected:,} tokens "
                f"({expected * dtype.itemsize:,} bytes){hint}; {redo}")
        for path, size in sizes.items():
            if size % dtype.itemsize:
                raise DamagedFileError(f"{path}: {size:,} bytes is not a multiple of {dtype.itemsize} "
                                       f"(meta.json's dtype {meta['dtype']}); the file is truncated or the dtype "
                                       f"is wrong; {redo}")
            if not size:
                continue
            with open(path, "rb") as f:
                head = np.frombuffer(f.read(min(size, SAMPLE_BYTES)), dtype=dtype)
                f.seek(max(0, size - SAMPLE_BYTES) // dtype.itemsize * dtype.itemsize)
                tail = np.frombuffer(f.read(), dtype=dtype)
            top = int(max(head.max(), tail.max()))
            if top >= meta["vocab_size"]:
                raise DamagedFileError(f"{path}: holds token id {top}, not below meta.json's vocab_size "
                                       f"{meta['vocab_size']} (read as {meta['dtype']}); the dtype or the file "
                                       f"is wrong; {redo}")
            if int(tail[-1]) != meta["eos_id"]:
                raise DamagedFileError(f"{path}: the last token is {int(tail[-1])}, not the EOS id {meta['eos_id']} "
                                       f"every shard file ends with; the file is truncated or damaged; {redo}")


def open_split(shard_dir: str | Path, split: str, meta: dict[str, Any] | None = None) -> list[np.memmap]:
    """Read-only memory maps of one split's shard files, in order.

    Each map is a 1-D array of token ids, shape (tokens_in_file,), dtype uint16 or uint32
    (little-endian). A split with no documents gives []. The maps hold no data in memory; the
    OS pages it in on access.

    Raises:
        FileNotFoundError / ValueError: as `load_meta`, or a listed shard file is missing or its
            size does not fit the dtype, or the files' total token count differs from meta.json.
        KeyError: `split` is not in meta.json.
    """
    shard_dir = Path(shard_dir)
    meta = meta if meta is not None else load_meta(shard_dir)
    if split not in meta["splits"]:
        raise KeyError(f"split {split!r} not in {shard_dir}/meta.json (has {sorted(meta['splits'])})")
    dtype = np.dtype("<u2" if meta["dtype"] == "uint16" else "<u4")
    maps = []
    total = 0
    for name in meta["splits"][split]["files"]:
        path = shard_dir / name
        if not path.is_file():
            raise FileNotFoundError(f"shard file {path} listed in meta.json is missing")
        size = path.stat().st_size
        if size % dtype.itemsize:
            raise ValueError(f"{path}: size {size} bytes is not a multiple of {dtype.itemsize} ({meta['dtype']})")
        if size == 0:
            continue
        mm = np.memmap(path, dtype=dtype, mode="r")
        total += mm.shape[0]
        maps.append(mm)
    expected = meta["splits"][split]["tokens"]
    if total != expected:
        raise ValueError(f"{shard_dir}: split {split!r} files hold {total} tokens but meta.json says {expected}")
    return maps


def load_tokenizer(shard_dir: str | Path, meta: dict[str, Any] | None = None) -> Tokenizer:
    """The tokenizer stored in a shard folder, checked against meta.json's hash.

    Raises:
        ValueError: tokenizer.json does not match `tokenizer_sha256` in meta.json.
    """
    shard_dir = Path(shard_dir)
    meta = meta if meta is not None else load_meta(shard_dir)
    tok = Tokenizer.from_file(shard_dir / "tokenizer.json")
    if tok.sha256 != meta["tokenizer_sha256"]:
        raise ValueError(f"{shard_dir}/tokenizer.json does not match meta.json's tokenizer_sha256 "
                         f"(the folder was modified after prepare)")
    return tok
