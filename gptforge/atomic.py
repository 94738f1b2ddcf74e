"""Crash-safe writes (temp file, fsync, rename), staged output folders and file hashing.

A reader (or a resumed job) sees either the old file or the complete new one, never half of it.
Files get the usual permissions (0666 minus the umask), also when a library wrote them with a
private mode (safetensors writes 0600), so exported models are readable by a serving process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")


def fsync_dir(path: str | Path) -> None:
    """fsync a directory so that renames inside it survive a power loss (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file(path: str | Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def default_mode(path: str | Path) -> None:
    """Give `path` the permissions a plain `open()` would: 0666 minus the process umask."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` through a temp file in the same folder, fsync, rename, fsync the folder."""
    path = Path(path)
    tmp = _tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(path.parent)


@contextlib.contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path beside `path` for a writer that wants a file name (Arrow, numpy);
    on a clean exit the file is fsynced, renamed onto `path` and the folder fsynced; on an
    exception it is removed and `path` is left as it was."""
    path = Path(path)
    tmp = _tmp_name(path)
    try:
        yield tmp
        fsync_file(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(path.parent)


def atomic_save_npy(path: str | Path, array: Any) -> None:
    """`numpy.save` of `array` to `path` (the name is kept as given) through `atomic_path`."""
    import numpy as np

    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, array)


def atomic_write_text(path: str | Path, text: str) -> None:
    """UTF-8 text version of `atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any, indent: int = 2) -> None:
    """`obj` as JSON (UTF-8, not ASCII-escaped, trailing newline) via `atomic_write_bytes`."""
    atomic_write_bytes(path, (json.dumps(obj, indent=indent, ensure_ascii=False) + "\n").encode("utf-8"))


def atomic_copy(src: str | Path, dst: str | Path) -> None:
    """Copy `src` to `dst` atomically (temp copy, fsync, rename)."""
    dst = Path(dst)
    tmp = _tmp_name(dst)
    try:
        shutil.copyfile(src, tmp)
        fsync_file(tmp)
        os.replace(tmp, dst)
    finally:
        if tmp.exists():
            tmp.unlink()


def replace_dir(tmp: str | Path, out: str | Path) -> None:
    """Rename a finished temp folder onto `out`; an existing `out` is moved aside first and removed
    only after the rename, so a kill leaves either the old or the new folder in place."""
    tmp, out = Path(tmp), Path(out)
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)
    fsync_dir(out.parent)


def check_not_inside(out: str | Path, inputs, option: str = "--out") -> None:
    """Refuse an output folder whose replacement would delete an input: `out` is one of `inputs`
    or a folder above one (`--out` inside an input is allowed: replacing it deletes only itself).

    inputs: paths (files, folders, or globs: the part before the first `*?[` is compared).
    Paths are compared after resolving symlinks and `..`.

    Raises:
        InputError: an input lies at or under `out` (the message names both and what to do).
    """
    from gptforge.errors import InputError

    out_r = Path(out).resolve()
    for inp in inputs:
        text = str(inp)
        cut = min((i for i in (text.find(c) for c in "*?[") if i >= 0), default=-1)
        base_r = Path((os.path.dirname(text[:cut]) or ".") if cut >= 0 else text).resolve()
        if base_r == out_r or out_r in base_r.parents:
            raise InputError(f"{option} {out} holds the input {inp}: replacing it would delete that input; "
                             f"choose an {option} outside it")


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB pieces."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def remove_dead_staging(out: str | Path) -> list[Path]:
    """Remove the staging folders `.OUT.tmp-PID` beside `out` whose process PID is gone (a killed
    writer's); a live process's are left alone. Returns the folders removed."""
    out = Path(out)
    removed = []
    for p in out.parent.glob(f".{out.name}.tmp-*"):
        pid = p.name[len(f".{out.name}.tmp-"):]  # exactly .OUT.tmp-PID (staged_dir's own names)
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # alive: not ours to remove
        except PermissionError:
            continue  # alive, another user's
        except (ProcessLookupError, OverflowError):
            pass  # gone (or no such pid at all)
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


@contextlib.contextmanager
def staged_dir(out: str | Path, overwrite: bool = False):
    """Yield an empty temporary folder beside `out`; on a clean exit it replaces `out` (see
    `gptforge.atomic.replace_dir`), on an exception it is removed and `out` is left as it was.

    Raises:
        InputError: `out` exists and not overwrite.
    """
    from gptforge.errors import InputError

    out = Path(out)
    if out.exists() and not overwrite:
        raise InputError(f"{out} exists; choose another --out or pass --overwrite")
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_staging(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        for f in tmp.rglob("*"):
            if f.is_file():
                fsync_file(f)
        for d in [tmp, *(d for d in tmp.rglob("*") if d.is_dir())]:
            fsync_dir(d)
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
