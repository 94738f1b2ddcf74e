"""A two-node Ray cluster on loopback for tests and benchmarks, stopped by the ids of its processes.

`LoopbackCluster` starts a helper process (`python -m tests.ray_cluster`) that moves itself into
a network namespace of its own (Linux, root or CAP_SYS_ADMIN) holding only a loopback interface,
starts a Ray head on 127.0.0.2 and one more node on 127.0.0.3 (one CPU each, through
`ray.cluster_utils.Cluster`) and waits. Why a namespace: Ray's gRPC servers (GCS, raylets,
workers) listen on the wildcard address `::`, which no option narrows; inside a namespace whose
only interface is `lo`, a wildcard listener is reachable on loopback alone, and the nodes'
addresses (127.0.0.2/3, never 127.0.0.1, which Ray replaces by the machine's outward address)
keep every connection there. Commands that talk to the cluster (a `gptforge prepare` driver)
run in the same namespace through `popen`.

Stopping never uses `ray stop` (it ends every Ray process of the machine): closing the helper's
stdin makes it shut its own cluster down, then every process this object saw started (the
helper's descendants, the commands run through `popen`) is killed by pid (`close`).
`listeners()` reads each such process's TCP listening sockets from `/proc/PID/net/tcp{,6}`, the
table of its own namespace (psutil's `net_connections` reads the caller's namespace, so it misses
them), for tests to check that nothing listens outside loopback.
"""

from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

CLONE_NEWNET = 0x40000000
HEAD_IP, NODE_IP = "127.0.0.2", "127.0.0.3"
#: smallest object store Ray accepts is 75 MiB; our tasks pass only small dicts.
OBJECT_STORE_BYTES = 100 << 20
REPO = Path(__file__).resolve().parents[1]


class ClusterUnavailable(RuntimeError):
    """Ray, or the network namespace it runs in here, cannot be started (the message says why)."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def own_network_namespace() -> None:
    """Move this process into a new network namespace and bring its loopback interface up."""
    import fcntl
    import socket
    import struct

    if _libc().unshare(CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), f"unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno())}")
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
        flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH", b"lo", 0)))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))
    finally:
        s.close()


def enter_network_namespace(pid: int) -> None:
    """Join the network namespace of process `pid` (for `preexec_fn`)."""
    fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    try:
        if _libc().setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns(CLONE_NEWNET)")
    finally:
        os.close(fd)


def private_mount(folder: Path) -> None:
    """Move this process into a mount namespace of its own and mount an empty tmpfs on `folder`."""
    CLONE_NEWNS, MS_REC, MS_PRIVATE = 0x00020000, 0x4000, 1 << 18
    libc = _libc()
    if libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    if libc.mount(b"tmpfs", str(folder).encode(), b"tmpfs", 0, b"size=64m") != 0:
        raise OSError(ctypes.get_errno(), f"mount tmpfs {folder}")


def _socket_inodes(pid: int) -> set[str]:
    found = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                found.add(target[8:-1])
    except OSError:
        pass
    return found


def _hex_address(text: str) -> str:
    raw = bytes.fromhex(text)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))  # four host-order 32-bit words
    return str(ipaddress.IPv6Address(words))


def listening_sockets(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket of process `pid` in state LISTEN, read in its namespace."""
    inodes = _socket_inodes(pid)
    out = []
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # 0A: TCP_LISTEN
                addr, port = f[1].rsplit(":", 1)
                out.append((_hex_address(addr), int(port, 16)))
    return out


def interfaces(pid: int) -> list[str]:
    """Network interfaces of process `pid`'s namespace (from `/proc/PID/net/dev`)."""
    lines = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
    return [line.split(":", 1)[0].strip() for line in lines]


def reaches_beyond_loopback(address: str, pid: int) -> bool:
    """Whether a socket listening on `address` in `pid`'s namespace accepts non-loopback traffic.

    A wildcard (0.0.0.0, ::) does unless the namespace's only interface is `lo`."""
    ip = ipaddress.ip_address(address)
    if ip.is_loopback or (isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped and ip.ipv4_mapped.is_loopback):
        return False
    if ip.is_unspecified:
        return interfaces(pid) != ["lo"]
    return True


class LoopbackCluster:
    """The cluster of the module docstring; a context manager. `address` is the head's GCS address."""

    def __init__(self, start_timeout: float = 240.0):
        import psutil

        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": _pythonpath()}
        self.helper = subprocess.Popen([sys.executable, "-m", "tests.ray_cluster"], cwd=REPO, env=env,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._seen: dict[int, float] = {}  # pid -> create time, so a reused pid is never killed
        self._psutil = psutil
        line = self._read_line(start_timeout)
        if not line.startswith("{"):
            err = self._stop_and_stderr()
            raise ClusterUnavailable(f"{line.strip() or 'no address'}; {err[-1500:]}")
        self.address = json.loads(line)["address"]
        self.remember()

    def _read_line(self, timeout: float) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if select.select([self.helper.stdout], [], [], 1.0)[0]:
                return self.helper.stdout.readline().decode()
            if self.helper.poll() is not None:
                return self.helper.stdout.readline().decode()
        return f"the cluster did not start within {timeout:.0f} s"

    def _stop_and_stderr(self) -> str:
        self.remember()
        self.close()
        return self.helper.stderr.read().decode(errors="replace") if self.helper.stderr else ""

    def remember(self, pid: int | None = None) -> None:
        """Note `pid` (default: the helper) and its live descendants as started by us."""
        try:
            root = self._psutil.Process(self.helper.pid if pid is None else pid)
            for p in [root, *root.children(recursive=True)]:
                self._seen.setdefault(p.pid, p.create_time())
        except self._psutil.Error:
            pass

    def popen(self, args: list[str], private_folder: Path | None = None, **kwargs) -> subprocess.Popen:
        """Start `args` inside the cluster's network namespace (its pid is remembered).

        With `private_folder`, the command also gets a mount namespace of its own with an empty
        tmpfs on that folder: what it writes there, the cluster's nodes cannot see (a driver
        whose work folder is not on shared storage)."""
        helper = self.helper.pid

        def enter() -> None:
            enter_network_namespace(helper)
            if private_folder is not None:
                private_mount(private_folder)

        proc = subprocess.Popen(args, preexec_fn=enter, **kwargs)
        self.remember(proc.pid)
        return proc

    def run(self, args: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
        """`popen` to completion; stdout and stderr captured as text. Raises TimeoutExpired (killed)."""
        proc = self.popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        return subprocess.CompletedProcess(args, proc.returncode, out, err)

    def processes(self):
        """The live processes started by this cluster (psutil.Process), descendants refreshed."""
        for pid in list(self._seen):
            self.remember(pid)
        live = []
        for pid, created in self._seen.items():
            try:
                p = self._psutil.Process(pid)
                if p.create_time() == created:
                    live.append(p)
            except self._psutil.Error:
                continue
        return live

    def listeners(self) -> list[tuple[int, str, str, int]]:
        """(pid, name, address, port) of every listening TCP socket of our live processes."""
        out = []
        for p in self.processes():
            try:
                name = p.name()
                out += [(p.pid, name, a, port) for a, port in listening_sockets(p.pid)]
            except (self._psutil.Error, OSError):
                continue
        return out

    def close(self) -> None:
        """Stop the cluster: the helper shuts it down, then what is left is killed by pid."""
        procs = self.processes()
        if self.helper.poll() is None:
            try:
                self.helper.stdin.close()
                self.helper.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                pass
        for p in procs:
            try:
                p.send_signal(signal.SIGKILL)
            except self._psutil.Error:
                pass
        self._psutil.wait_procs(procs, timeout=10)
        if self.helper.poll() is None:
            self.helper.kill()
        self.helper.wait()

    def __enter__(self) -> LoopbackCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _pythonpath() -> str:
    parts = [str(REPO), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return os.pathsep.join(dict.fromkeys(parts))


def _serve() -> None:
    """The helper: namespace, two nodes, print the address, wait for stdin to close, shut down."""
    try:
        own_network_namespace()
        from ray.cluster_utils import Cluster
    except (OSError, ImportError) as e:
        print(f"cannot start: {e}", flush=True)
        return
    import shutil
    import tempfile

    temp = tempfile.mkdtemp(prefix="ray-")  # Ray's logs and sockets, removed after (not /tmp/ray)
    # Ray 2.60's Cluster writes the head's address to <system temp>/ray/ray_current_cluster whatever
    # temp_dir says, and fails on a machine where that folder was never made.
    from ray._private.utils import get_ray_address_file

    os.makedirs(os.path.dirname(get_ray_address_file(None)), exist_ok=True)
    node = {"num_cpus": 1, "object_store_memory": OBJECT_STORE_BYTES, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "node_ip_address": HEAD_IP, "temp_dir": temp})
    try:
        cluster.add_node(**{**node, "node_ip_address": NODE_IP})
        cluster.wait_for_nodes()
        print(json.dumps({"address": cluster.address}), flush=True)
        sys.stdin.read()
    finally:
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    _serve()
