"""Worker processes for prepare's per-shard tasks: one pool per run, tasks skipped when done.

`run_tasks` is the one entry of every phase: it runs a task function over the tasks whose
result is not yet in the work folder, in this process (one worker) or in spawned processes
that die with their parent, or hands them to another `Executor` (`ray_executor.RayExecutor`:
Ray tasks on a cluster). A task writes its own result files; the order in which tasks finish,
and what ran them, never changes an output.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, Protocol


class Executor(Protocol):
    """What runs a phase's shard tasks: `WorkerPool` (local processes) or `RayExecutor` (Ray).

    `workers` is how many tasks run at once; `run_tasks` runs `fn(task)` for every task whose
    index is not `done`, as the module function `run_tasks` documents.
    """

    workers: int

    def run_tasks(self, fn: Callable[[dict[str, Any]], dict[str, Any]], tasks: list[dict[str, Any]],
                  done: Callable[[int], bool], progress: Any = None, description: str = "") -> None: ...


def default_workers() -> int:
    """The CPU cores this process may run on (`--workers 0`)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


class WorkerPool:
    """Worker processes shared by every phase of one run (spawned once, on first need).

    Spawning a worker costs an interpreter start and the imports (~0.5 s per worker, more on a
    loaded machine); one pool per phase paid that three times, which on a small corpus cost as
    much as the work. With `workers` <= 1 no process is started and tasks run in this one.
    Use as a context manager; leaving it shuts the processes down.
    """

    def __init__(self, workers: int, lock_folder: str | Path | None = None):
        self.workers = max(1, int(workers))
        self.lock_folder = str(lock_folder) if lock_folder is not None else None
        self._pool: ProcessPoolExecutor | None = None

    def executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            import multiprocessing as mp

            # spawn: forking a process whose Rust thread pools (tokenizers, rensa) already ran can deadlock.
            self._pool = ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"), initializer=_worker_init,
                                             initargs=(os.getpid(), self.lock_folder, reader_modules()))
        return self._pool

    def run_tasks(self, fn: Callable[[dict[str, Any]], dict[str, Any]], tasks: list[dict[str, Any]],
                  done: Callable[[int], bool], progress: Any = None, description: str = "") -> None:
        """The module's `run_tasks` in this pool (the `Executor` protocol)."""
        run_tasks(fn, tasks, done, self, progress, description)

    def close(self, cancel: bool = False) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=cancel)
            self._pool = None

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(cancel=exc_type is not None)


def run_tasks(fn: Callable[[dict[str, Any]], dict[str, Any]], tasks: list[dict[str, Any]], done: Callable[[int], bool],
              workers: int | Executor, progress: Any = None, description: str = "") -> None:
    """Run `fn(task)` for every task whose index is not `done`, in `workers` processes.

    `workers` is a count (a pool is made for this call), a `WorkerPool` shared between calls, or
    another `Executor`, which gets the call. Each task writes its own result files; this only
    schedules. Results are not needed in order because they are files named by shard index. A
    Ctrl-C cancels what has not started (finished shards stay done for the next run).
    """
    if not isinstance(workers, (int, WorkerPool)):
        return workers.run_tasks(fn, tasks, done, progress, description)
    todo = [t for t in tasks if not done(t["index"])]
    bar = progress.add_task(description, total=len(tasks), completed=len(tasks) - len(todo),
                            info=f"{len(tasks) - len(todo)} reused" if len(todo) < len(tasks) else "") if progress else None
    if not todo:
        return
    n = workers.workers if isinstance(workers, WorkerPool) else max(1, int(workers))
    if n <= 1 or len(todo) == 1:
        for t in todo:
            fn(t)
            if bar is not None:
                progress.advance(bar)
        return
    if not isinstance(workers, WorkerPool):
        with WorkerPool(n) as own:
            return run_tasks(fn, tasks, done, own, progress, description)
    pool = workers.executor()
    pending = set()
    it = iter(todo)
    try:
        for t in itertools.islice(it, 2 * n):
            pending.add(pool.submit(fn, t))
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                fut.result()
                if bar is not None:
                    progress.advance(bar)
                nxt = next(it, None)
                if nxt is not None:
                    pending.add(pool.submit(fn, nxt))
    except BaseException:
        for fut in pending:
            fut.cancel()
        raise


#: seconds between a worker's checks that its parent still lives (where no parent-death signal).
WATCHDOG_SECONDS = 1.0


def die_with_parent(parent_pid: int) -> None:
    """End this process as soon as `parent_pid` (its parent) dies, whatever the cause.

    On Linux the kernel sends SIGKILL on the parent's death (prctl PR_SET_PDEATHSIG); elsewhere a
    daemon thread checks the parent pid every `WATCHDOG_SECONDS`. Either way, if the parent is
    already gone when this runs (it died while we started), the process exits at once.
    Without this, `kill -9` of `prepare` left its spawn workers writing into the work folder.
    """
    import signal
    import threading

    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(WATCHDOG_SECONDS)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def reader_modules() -> tuple[str, ...]:
    """The modules outside gptforge that define a registered `Reader` (an out-of-tree format,
    imported by the program that runs prepare): a spawned worker imports them too, so that their
    classes register there as well (docs/extending.md)."""
    from gptforge.data.readers import READERS

    # a script's own classes (__main__) come with it: spawn runs the script's module in the worker
    return tuple(dict.fromkeys(c.__module__ for c in READERS
                               if not c.__module__.startswith("gptforge.") and c.__module__ != "__main__"))


def _worker_init(parent_pid: int | None = None, lock_folder: str | None = None, modules: tuple[str, ...] = ()) -> None:
    import importlib

    for name in modules:  # out-of-tree readers (`reader_modules`)
        importlib.import_module(name)
    if parent_pid is not None:
        die_with_parent(parent_pid)
    if lock_folder is not None:
        from gptforge.runtime.lock import hold_as_helper

        hold_as_helper(lock_folder)
    # Each worker is one core's worth of work; Rust thread pools inside each would oversubscribe.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    logging.getLogger("gptforge.data").setLevel(logging.ERROR)  # the main process reports warnings
