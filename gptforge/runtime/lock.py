"""An exclusive lock on an output folder (a run directory, a shard folder), one writer at a time.

The lock is a small file beside the folder, `.<name>.lock` (beside, so that removing or renaming
the folder never drops it), holding JSON with the holder's pid, host, command and start time.
Holding it means holding an `fcntl.flock` on that file: the kernel releases the lock when the
holder exits in any way, `kill -9` included, so a lock file left by a dead process is stale by
construction and the next writer takes it over (saying so). A second writer while the holder
lives gets `FolderLockedError` naming the holder. Where `fcntl` is missing (Windows) the file
is created exclusively instead and a holder whose pid no longer runs on this host is stale.

flock works on local file systems and on NFSv4 (Linux maps it to byte-range locks there); on a
shared file system without lock support two hosts are not kept apart.

Example::

    with FolderLock(run_dir, command="pretrain"):
        ...  # write into run_dir

Child processes started with `spawn` or `subprocess` do not inherit the lock's descriptor
(Python opens it non-inheritable). Worker processes that write into the folder call
`hold_as_helper(folder)` once: it takes a shared lock on `.<name>.lock.helpers`, and `acquire()`
waits (up to `helper_wait` seconds) for an exclusive lock on that file, so a new writer never
runs beside a dead writer's workers that are still finishing.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from gptforge.errors import GptforgeError

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

log = logging.getLogger("gptforge")


class FolderLockedError(GptforgeError, RuntimeError):
    """Another live process holds the folder's lock (the message names pid, host and command)."""


def lock_path_for(folder: str | Path) -> Path:
    """The lock file of `folder`: `.<name>.lock` beside it."""
    folder = Path(folder).absolute()
    return folder.parent / f".{folder.name}.lock"


def helpers_path_for(folder: str | Path) -> Path:
    """The helpers' lock file of `folder`: `.<name>.lock.helpers` beside it."""
    p = lock_path_for(folder)
    return p.with_name(p.name + ".helpers")


_HELD_AS_HELPER: list[int] = []


def hold_as_helper(folder: str | Path) -> None:
    """Mark this process as a helper of the writer of `folder` until it exits (see module docstring).

    Takes a shared flock on the helpers file and keeps its descriptor open for the life of the
    process. No effect without fcntl.
    """
    if fcntl is None:  # pragma: no cover - Windows
        return
    path = helpers_path_for(folder)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)
    _HELD_AS_HELPER.append(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def read_holder(path: str | Path) -> dict[str, Any] | None:
    """The holder record of a lock file ({pid, host, command, started}), or None if unreadable."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def describe_holder(holder: dict[str, Any] | None) -> str:
    """"pid 123 on host h (gptforge prepare, since 2026-12-01 10:00:00 UTC)" or "an unknown process"."""
    if not holder:
        return "an unknown process"
    since = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since)) if isinstance(since, (int, float)) else "?"
    return f"pid {holder.get('pid')} on host {holder.get('host')} ({holder.get('command') or '?'}, since {when})"


class FolderLock:
    """Exclusive lock on `folder` for one process (see the module docstring).

    Args:
        folder: the folder to protect (it need not exist yet; its parent is created).
        command: what the holder is doing, shown to a refused second writer.

    `acquire()` raises `FolderLockedError` when a live process holds the lock; `release()` (also
    on leaving the `with` block and at interpreter exit) deletes the lock file. Re-entrant use
    of one object is an error; a second `FolderLock` on the same folder in the same process is
    refused like any other writer.
    """

    def __init__(self, folder: str | Path, command: str = "", helper_wait: float = 30.0):
        self.folder = Path(folder)
        self.helper_wait = float(helper_wait)
        self.path = lock_path_for(folder)
        self.command = command or " ".join(["gptforge"] + sys.argv[1:3])
        self._fd: int | None = None
        self.took_over: dict[str, Any] | None = None  # the stale holder replaced, if any

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> FolderLock:
        if self._fd is not None:
            raise RuntimeError(f"{self.path}: already held by this FolderLock")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if fcntl is None:  # pragma: no cover - Windows
            self._acquire_exclusive_create()
        else:
            self._acquire_flock()
            try:
                self._wait_for_helpers()
            except BaseException:
                self.release()
                raise
        if self.took_over:
            log.warning(f"{self.folder}: took over a stale lock left by {describe_holder(self.took_over)}, "
                        f"which is no longer running")
        import atexit

        atexit.register(self.release)
        return self

    def _record(self) -> bytes:
        return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": self.command,
                           "started": time.time()}).encode()

    def _refuse(self, holder: dict[str, Any] | None) -> FolderLockedError:
        return FolderLockedError(
            f"{self.folder} is in use by {describe_holder(holder)}; wait for it to finish or stop it, "
            f"or use another folder (lock file {self.path})")

    def _acquire_flock(self) -> None:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise self._refuse(read_holder(self.path)) from None
            # The holder before us may have deleted the file between our open and our flock:
            # then we locked an orphan inode and must start again on the new file.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            old = os.read(fd, 4096)
            if old.strip():
                try:
                    self.took_over = json.loads(old)
                except ValueError:
                    self.took_over = {"pid": "?", "host": "?", "command": "unreadable lock file"}
            os.ftruncate(fd, 0)
            os.pwrite(fd, self._record(), 0)
            os.fsync(fd)
            self._fd = fd
            return

    def _wait_for_helpers(self) -> None:
        """Wait until no helper process of an earlier writer holds the helpers file."""
        path = helpers_path_for(self.folder)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + self.helper_wait
            warned = False
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    return
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise FolderLockedError(
                            f"{self.folder}: worker processes of an earlier run still hold {path} after "
                            f"{self.helper_wait:.0f} s; stop them (e.g. `fuser {path}` lists them) and run again"
                        ) from None
                    if not warned:
                        log.warning(f"{self.folder}: waiting for worker processes of an earlier run to exit")
                        warned = True
                    time.sleep(0.1)
        finally:
            os.close(fd)

    def _acquire_exclusive_create(self) -> None:  # pragma: no cover - exercised only without fcntl
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                holder = read_holder(self.path)
                pid = holder.get("pid") if holder else None
                if holder and holder.get("host") == socket.gethostname() and isinstance(pid, int) \
                        and not _pid_alive(pid):
                    self.took_over = holder
                    os.unlink(self.path)
                    continue
                raise self._refuse(holder) from None
            os.write(fd, self._record())
            self._fd = fd
            return
        raise self._refuse(read_holder(self.path))

    def release(self) -> None:
        """Delete the lock file and drop the lock (nothing when not held)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        self._remove_helpers_file()
        try:
            os.unlink(self.path)  # unlink while still locked: a waiter re-checks the inode
        except FileNotFoundError:
            pass
        os.close(fd)

    def _remove_helpers_file(self) -> None:
        """Delete the helpers file, but only when no helper holds it (one still running keeps it)."""
        if fcntl is None:  # pragma: no cover - Windows
            return
        path = helpers_path_for(self.folder)
        try:
            hfd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(hfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(path)
        except (BlockingIOError, FileNotFoundError):
            pass
        finally:
            os.close(hfd)

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.release()
