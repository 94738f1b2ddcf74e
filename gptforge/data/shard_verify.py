"""Checks of a shard folder's content: each .bin file's SHA-256 against meta.json, and every id
below the vocabulary size.

`load_meta`'s `check_files` is the cheap check every open makes (sizes, dtype, the ends of each
file); this module reads every byte. `verify_shards` is `gptforge prepare --verify DIR`;
`check_at_start` is what a run does when it opens its data: the full check when the shards hold
at most VERIFY_AT_START_BYTES (SHA-256 reads well above 500 MB/s on one core, so a second or
two), else a line saying how to run it. A damaged id that gets past both is caught when its
window is read (`loader.TokenStream` with its vocab_size).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from gptforge.errors import DamagedFileError

#: a run checks its shards' checksums when it starts if they hold at most this many bytes.
VERIFY_AT_START_BYTES = 2 << 30
#: bytes read at a time (a multiple of every dtype's size).
CHUNK_BYTES = 1 << 22


def out_of_vocab_error(path: Path, token_offset: int, value: int, vocab_size: int) -> DamagedFileError:
    """The one message for an id at or above the vocabulary size, naming the file and offset."""
    return DamagedFileError(f"{path}: token id {value} at token offset {token_offset:,} is not below the "
                            f"vocab_size {vocab_size} of meta.json; the file is damaged; check the folder with "
                            f"`gptforge prepare --verify {path.parent}` and re-run `gptforge prepare` for it")


def _scan(path: Path, dtype: np.dtype, vocab_size: int) -> str:
    """SHA-256 hex of `path`; raises on the first id >= vocab_size (DamagedFileError)."""
    h = hashlib.sha256()
    offset = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            h.update(chunk)
            ids = np.frombuffer(chunk, dtype=dtype)
            if ids.size and int(ids.max()) >= vocab_size:
                i = int(np.flatnonzero(ids >= vocab_size)[0])
                raise out_of_vocab_error(path, offset + i, int(ids[i]), vocab_size)
            offset += ids.size
    return h.hexdigest()


def _files(meta: dict[str, Any]) -> list[str]:
    return [name for s in meta["splits"].values() for name in s.get("files", [])]


def verify_shards(shard_dir: str | Path) -> dict[str, Any]:
    """Read every .bin file of a shard folder (or of each source of a `prepare --source` folder):
    its SHA-256 against meta.json's `file_sha256` and every id against `vocab_size`.

    Returns:
        {"files": int, "bytes": int, "checksums": bool} (checksums False: meta.json records
        none, an older folder, so only the ids and sizes were checked).

    Raises:
        DamagedFileError: naming the file whose checksum differs or the file and token offset of
            an id at or above the vocabulary size. And what `load_meta` raises.
    """
    import json

    from gptforge.data.shards import load_meta

    shard_dir = Path(shard_dir)
    top = shard_dir / "meta.json"
    if top.is_file():
        try:
            data = json.loads(top.read_text(encoding="utf-8"))
        except ValueError:
            data = {}
        if isinstance(data, dict) and data.get("format") == "gptforge-mixture":
            parts = [verify_shards(shard_dir / s["path"]) for s in data.get("sources", [])]
            return {"files": sum(p["files"] for p in parts), "bytes": sum(p["bytes"] for p in parts),
                    "checksums": all(p["checksums"] for p in parts)}
    meta = load_meta(shard_dir)
    dtype = np.dtype("<u2" if meta["dtype"] == "uint16" else "<u4")
    recorded = meta.get("file_sha256") or {}
    n_bytes = 0
    for name in _files(meta):
        path = shard_dir / name
        got = _scan(path, dtype, int(meta["vocab_size"]))
        n_bytes += path.stat().st_size
        if recorded and recorded.get(name) != got:
            raise DamagedFileError(f"{path}: its SHA-256 ({got[:16]}...) is not the one meta.json records "
                                   f"({str(recorded.get(name))[:16]}...): the file changed after `gptforge prepare` "
                                   f"wrote it; re-run `gptforge prepare` for {shard_dir}")
    return {"files": len(_files(meta)), "bytes": n_bytes, "checksums": bool(recorded)}


def check_at_start(shard_dir: str | Path, meta: dict[str, Any], log=None,
                   limit: int = VERIFY_AT_START_BYTES) -> bool:
    """The check a run makes when it opens a shard folder: `verify_shards` when its files hold at
    most `limit` bytes and meta.json records checksums; else a line to `log` naming the full
    check. Returns whether the full check ran.

    Raises:
        DamagedFileError: as `verify_shards`.
    """
    shard_dir = Path(shard_dir)
    if not meta.get("file_sha256"):
        return False
    total = sum((shard_dir / n).stat().st_size for n in _files(meta))
    if total > limit:
        if log is not None:
            log(f"{shard_dir}: {total / 2**30:.1f} GiB of shards: checksums not checked at start (over "
                f"{limit / 2**30:.0f} GiB); check them with `gptforge prepare --verify {shard_dir}`")
        return False
    verify_shards(shard_dir)
    return True
