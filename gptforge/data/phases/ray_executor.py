"""`--executor ray`: prepare's per-shard tasks as Ray tasks on a cluster, the same work shards.

`RayExecutor` has the seam of the local `WorkerPool` (`workers`, `run_tasks(fn, tasks, done,
progress, description)`): each phase hands it the same task dicts and task functions, each Ray
task runs one of them on one work shard and writes that shard's result files into the work
folder, and the driver (the `gptforge prepare` process) decides the corpus steps and writes the
output from those files exactly as it does after local workers. So the output is byte-identical
whatever ran the tasks: a shard's files depend only on its inputs and options.

The work folder (`.OUT.work`, beside --out), --out and the inputs must be on storage every node
mounts at the same path (NFS, Lustre, a cluster file system): tasks read inputs and write results
there, and the driver reads them back. `RayExecutor` checks this before the first task (one probe
per node that must find the work folder's own `fingerprint.json`, byte for byte, and the first and
last input), and every task checks it again (a node that joined later), failing with
`WorkFolderNotShared` naming the node. Relative paths work: each task runs in the driver's
working directory (which must be shared too).

Faults. Ray retries a task whose worker process or node died (`max_retries`, default
`MAX_RETRIES`); a task that raised is not retried (a bad file stays bad) and its own exception
ends the run, as under the local executor. A task that died on every attempt ends the run with
`ShardTaskError` naming the phase, the shard, its first input and Ray's reason. When the driver
dies, Ray ends its job's worker processes; a rerun resumes from the shards whose results exist.
While a task runs it holds the output's helper lock shared (`runtime.lock`), so a new writer
waits for the tasks of a dead driver that are still finishing.

Test hook: `GPTFORGE_FAULT_TASK=PHASE:SHARD` in the driver's environment (PHASE as the progress
bar names it: `curate`, `count lines`, `tokenizer sample`, `tokenize`) kills the worker process
(SIGKILL) running that shard's task at its first attempt (a marker file in the work folder
remembers it and holds its pid); `PHASE:SHARD:always` kills it at every attempt;
`PHASE:SHARD:stall` makes it wait forever (its pid in the marker), for a test that kills the
driver meanwhile. Several specs are separated by commas.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gptforge.data.readers.base import HF_PREFIX
from gptforge.errors import GptforgeError, InputError

log = logging.getLogger("gptforge.data")

#: attempts after the first that Ray gives a task whose worker or node died (Ray's own default).
MAX_RETRIES = 3
FAULT_ENV = "GPTFORGE_FAULT_TASK"
RAY_MISSING = "--executor ray needs Ray: pip install 'gptforge[ray]' (or pip install ray)"
SHARED_STORAGE = ("prepare --executor ray needs --out (its work folder .OUT.work lies beside it), the inputs "
                  "and the working directory on storage every node mounts at the same path (NFS, Lustre, a "
                  "cluster file system)")


class ShardTaskError(GptforgeError, RuntimeError):
    """A shard's task failed on every attempt (its worker or node died each time)."""


class WorkFolderNotShared(GptforgeError, RuntimeError):
    """A Ray node cannot see the work folder, the inputs or the driver's working directory."""


def import_ray():
    """The `ray` module, or InputError with the one line that says how to install it."""
    try:
        import ray
    except ImportError as e:
        raise InputError(f"{RAY_MISSING} ({e})") from None
    return ray


def check_reachable(address: str, timeout: float = 10.0) -> None:
    """InputError when nothing accepts a TCP connection at `address` (HOST:PORT); ray.init would
    retry such an address without end. Other forms (auto, ray://...) are left to Ray."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "/" in address:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise InputError(f"--ray-address {address}: no Ray cluster answers there ({e.strerror or e}); start one "
                         f"(ray start --head) or give its head's HOST:PORT") from None


def describe_shard(task: dict[str, Any]) -> str:
    """'work shard 3 (data/a.txt and 4 more files)' for an error message."""
    files = task.get("files") or []
    first = files[0]["path"] if files and isinstance(files[0], dict) else (files[0] if files else "")
    more = f" and {len(files) - 1} more file(s)" if len(files) > 1 else ""
    what = f"work shard {task.get('shard', task['index'])}" + (f" (part {task['name']})" if "name" in task else "")
    return f"{what} ({first}{more})" if first else what


# --------------------------------------------------------------------------------------------
# What runs on the nodes
# --------------------------------------------------------------------------------------------


def _visible(context: dict[str, Any]) -> list[str]:
    """What this node cannot see of what the driver sees (empty: all is well)."""
    problems = []
    if not os.path.isdir(context["cwd"]):
        problems.append(f"the working directory {context['cwd']}")
    marker = Path(context["work"]) / "fingerprint.json"
    try:
        if marker.read_bytes() != context["fingerprint"]:
            problems.append(f"the work folder {context['work']} (its fingerprint.json differs: another folder)")
    except OSError:
        problems.append(f"the work folder {context['work']}")
    for f in context.get("inputs", []):
        if not os.path.exists(f):
            problems.append(f"the input {f}")
    return problems


def _not_shared(problems: list[str]) -> WorkFolderNotShared:
    return WorkFolderNotShared(f"Ray node {socket.gethostname()} (pid {os.getpid()}) cannot see "
                               f"{'; '.join(problems)}: {SHARED_STORAGE}")


def probe_node(context: dict[str, Any]) -> tuple[str, list[str]]:
    """(host name, what it cannot see) on one node."""
    return socket.gethostname(), _visible(context)


def _fault(description: str, task: dict[str, Any], context: dict[str, Any]) -> None:
    """The test hook of the module docstring (`FAULT_ENV`, forwarded by the driver)."""
    for spec in filter(None, (context.get("fault") or "").split(",")):
        phase, _, rest = spec.strip().partition(":")
        shard, _, mode = rest.partition(":")
        if phase != description or shard != str(task.get("index")):
            continue
        marker = Path(context["work"]) / f".fault-{description.replace(' ', '_')}-{task['index']:05d}"
        if mode == "stall":  # for a test that kills the driver while a task runs
            marker.write_text(str(os.getpid()))
            while True:
                time.sleep(1)
        if mode != "always":
            try:
                with open(marker, "x") as f:
                    f.write(str(os.getpid()))
            except FileExistsError:
                continue
        os.kill(os.getpid(), signal.SIGKILL)


def run_shard_task(fn: Callable[[dict[str, Any]], dict[str, Any]], task: dict[str, Any], description: str,
                   context: dict[str, Any]) -> dict[str, Any]:
    """One task on a node: check the shared storage, join the driver's directory, run `fn(task)`.

    Holds the output's helper lock shared while `fn` runs (see the module docstring).
    """
    import fcntl

    from gptforge.runtime.lock import helpers_path_for

    problems = _visible({**context, "inputs": []})
    if problems:
        raise _not_shared(problems)
    os.chdir(context["cwd"])
    # One Ray task is one CPU's worth of work: Rust thread pools inside each would oversubscribe.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    logging.getLogger("gptforge.data").setLevel(logging.ERROR)  # the driver reports warnings
    _fault(description, task, context)
    fd = None
    if context.get("lock_folder"):
        fd = os.open(helpers_path_for(context["lock_folder"]), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        return fn(task)
    finally:
        if fd is not None:
            os.close(fd)


# --------------------------------------------------------------------------------------------
# The driver's side
# --------------------------------------------------------------------------------------------


class RayExecutor:
    """Runs prepare's shard tasks on a Ray cluster (see the module docstring); a context manager.

    Args:
        address: the cluster (`host:port` of its head, or `auto`); None: `RAY_ADDRESS`, else a
            local cluster started for this run (with `local_cpus` CPUs, 0: all) and stopped after.
        work_root: the run's work folder; its `fingerprint.json` must exist (the probes read it).
        lock_folder: the output folder whose helper lock tasks hold (None: none).
        inputs: input files; the probes check the first and the last on every node (`hf:` names
            are skipped).
        max_retries: Ray's retries of a task whose worker died.

    Raises (on entering):
        InputError: Ray is not installed, no cluster answers at `address`, or no node has a CPU.
        WorkFolderNotShared: a node cannot see the work folder, an input or the working directory.
    """

    def __init__(self, address: str | None, work_root: str | Path, lock_folder: str | Path | None = None,
                 inputs: Sequence[str | Path] = (), local_cpus: int = 0, max_retries: int = MAX_RETRIES):
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        self.work_root = Path(work_root).absolute()
        self.lock_folder = str(Path(lock_folder).absolute()) if lock_folder is not None else None
        # Files only: a hf:NAME dataset is streamed by each task from its hub, not from shared storage.
        self.inputs = [str(Path(p).absolute()) for p in inputs if not str(p).startswith(HF_PREFIX)]
        self.local_cpus = local_cpus
        self.max_retries = max_retries
        self.workers = 1
        self._ray: Any = None  # the ray module once entered (ray is imported on first use)
        self._started = False
        self._remote: Any = None  # the ray remote function once entered

    def __enter__(self) -> RayExecutor:
        ray = self._ray = import_ray()
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"logging_level": logging.WARNING}
            if self.address is None:
                # "local": a new instance even where this machine runs a cluster (ray.init() would join it).
                kwargs.update(include_dashboard=False, num_cpus=self.local_cpus or None)
            if self.address is not None:
                check_reachable(self.address)
            ray.init(address=self.address or "local", **kwargs)
            self._started = True
        try:
            self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
            self._remote = ray.remote(num_cpus=1, max_retries=self.max_retries, retry_exceptions=False)(run_shard_task)
            self.check_nodes()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def close(self) -> None:
        """Disconnect from the cluster (and stop it when this executor started it)."""
        if self._ray is not None and self._started:
            self._ray.shutdown()
        self._started = False

    def context(self) -> dict[str, Any]:
        """What every task gets besides its task dict (paths, the fingerprint's bytes, the fault hook)."""
        return {"cwd": os.getcwd(), "work": str(self.work_root), "lock_folder": self.lock_folder,
                "fingerprint": (self.work_root / "fingerprint.json").read_bytes(),
                "fault": os.environ.get(FAULT_ENV, "")}

    def check_nodes(self) -> None:
        """One probe on each alive node with CPUs; WorkFolderNotShared naming the first that fails."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray = self._ray
        context = {**self.context(), "inputs": sorted({self.inputs[0], self.inputs[-1]}) if self.inputs else []}
        probe = ray.remote(num_cpus=0, max_retries=self.max_retries)(probe_node)
        nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
        if not nodes:
            raise InputError(f"the Ray cluster {self.address or '(local)'} has no node with a CPU: its tasks could "
                             f"never start; start its nodes with --num-cpus N")
        refs = {probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                .remote(context): n for n in nodes}
        for ref, node in refs.items():
            try:
                host, problems = ray.get(ref)
            except ray.exceptions.RayTaskError as e:  # e.g. gptforge missing on that node
                raise WorkFolderNotShared(f"Ray node {node.get('NodeManagerAddress')}: the probe failed "
                                          f"({_first_line(e.cause if e.cause else e)}); gptforge must be installed "
                                          f"on every node") from None
            if problems:
                raise WorkFolderNotShared(f"Ray node {node.get('NodeManagerAddress')} (host {host}) cannot see "
                                          f"{'; '.join(problems)}: {SHARED_STORAGE}")

    def run_tasks(self, fn: Callable[[dict[str, Any]], dict[str, Any]], tasks: list[dict[str, Any]],
                  done: Callable[[int], bool], progress: Any = None, description: str = "") -> None:
        """Run `fn(task)` as a Ray task for every task whose index is not `done` (as `pool.run_tasks`).

        Raises:
            the task's own exception: a task raised (not retried).
            ShardTaskError: a task's worker died on every attempt (names the shard and the reason).
            WorkFolderNotShared: a node cannot see the work folder.
        """
        ray = self._ray
        todo = [t for t in tasks if not done(t["index"])]
        bar = progress.add_task(description, total=len(tasks), completed=len(tasks) - len(todo),
                                info=f"{len(tasks) - len(todo)} reused" if len(todo) < len(tasks) else "") if progress else None
        if not todo:
            return
        context = ray.put(self.context())
        pending = {self._remote.options(name=f"{description or fn.__name__}:{t['index']}")
                   .remote(fn, t, description, context): t for t in todo}
        try:
            while pending:
                finished, _ = ray.wait(list(pending), num_returns=1, timeout=None)
                for ref in finished:
                    task = pending.pop(ref)
                    self._result(ref, task, description)
                    if bar is not None:
                        progress.advance(bar)
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise

    def _result(self, ref: Any, task: dict[str, Any], description: str) -> Any:
        ray = self._ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            cause = e.cause
            if isinstance(cause, Exception):
                raise cause from None
            raise
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                ray.exceptions.RayError) as e:
            attempts = self.max_retries + 1
            raise ShardTaskError(f"prepare --executor ray: {description} of {describe_shard(task)} failed on "
                                 f"all {attempts} attempts: {type(e).__name__}: {_first_line(e)}") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__

