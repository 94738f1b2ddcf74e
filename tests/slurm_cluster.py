"""A real one-machine Slurm cluster for the tests: munged, slurmctld and one slurmd, started directly.

No systemd is needed (PID 1 need not be one): each daemon runs in the foreground as a child of
this process, with its files (config, key, sockets, state, logs) in one folder, on free ports,
and is stopped by its own pid. slurm.conf declares nodes n[1-8]; this machine is n1 (its real
topology from `slurmd -C`), the others are powered-down cloud nodes (State=CLOUD) that slurmctld
never starts, so `sbatch --test-only` can place 2- and 8-node jobs while real jobs run on n1.
Nodes declared State=DOWN would not do: Slurm 22.05 answers --test-only for them with
"Requested node configuration is not available". Every node declares 8 GPUs as GRES (gres.conf
names symlinks to /dev/null: slurmd checks only that each is a character device).

Debian: `apt-get install slurmctld slurmd slurm-client munge`. Command line, for a look by hand:
    python tests/slurm_cluster.py start DIR      # prints the SLURM_CONF to export
    python tests/slurm_cluster.py stop DIR
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
TOOLS = ("sbatch", "scontrol")
EXTRA_NODES = "n[2-8]"
GPUS_PER_NODE = 8
START_TIMEOUT_S = 60


class ClusterUnavailable(RuntimeError):
    """Slurm cannot run here; the message says why (missing program, not root, a daemon that died)."""


def why_unavailable() -> str | None:
    """Why a Slurm cluster cannot start on this machine, or None when it can be tried."""
    missing = [p for p in (*DAEMONS, *TOOLS) if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]
    if missing:
        return f"Slurm/munge not installed ({', '.join(missing)} missing; Debian: apt-get install slurmctld " \
               "slurmd slurm-client munge)"
    if os.geteuid() != 0:
        return "this helper runs slurmd as root (SlurmdUser=root, to start jobs), and this process is not root"
    return None


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_topology() -> str:
    """This machine as slurmd sees it: "CPUs=2 Boards=1 SocketsPerBoard=1 ... RealMemory=M"."""
    out = subprocess.run([_program("slurmd"), "-C"], capture_output=True, text=True, timeout=30).stdout
    line = next((ln for ln in out.splitlines() if ln.startswith("NodeName=")), None)
    if line is None:
        raise ClusterUnavailable(f"`slurmd -C` printed no node line: {out[-500:]!r}")
    return line.split(" ", 1)[1].strip()


def node_cpus(topology: str) -> int:
    """The CPUs= figure of a node_topology() line."""
    return int(re.search(r"\bCPUs=(\d+)", topology).group(1))


def write_config(root: Path) -> Path:
    """slurm.conf and gres.conf for this machine under `root`; returns the slurm.conf path."""
    topo = node_topology()
    for sub in ("state", "spool", "dev"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for i in range(GPUS_PER_NODE):
        gpu = root / "dev" / f"gpu{i}"
        if not gpu.is_symlink():
            gpu.symlink_to("/dev/null")
    conf = root / "slurm.conf"
    lines = [
        "ClusterName=gptforgetest",
        f"SlurmctldHost={socket.gethostname().split('.')[0]}(127.0.0.1)",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={root / 'munge.socket'}",
        f"StateSaveLocation={root / 'state'}", f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}", f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'slurmctld.log'}", f"SlurmdLogFile={root / 'slurmd.log'}",
        # No cgroups here: processes are tracked by parentage, tasks are not bound to CPUs.
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "MpiDefault=none", "SwitchType=switch/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "ReturnToService=2",
        # The cloud nodes stay powered down: nothing resumes them (a job sent there fails instead).
        "SuspendProgram=/bin/true", "ResumeProgram=/bin/false", "SuspendTime=INFINITE",
        # Finished jobs' records are never purged, so `sbatch --wait` polls every 2 s: with a
        # nonzero MinJobAge it sleeps 2, 8, then 32 s (so a 12 s job returned after 42 s).
        "MinJobAge=0",
        "GresTypes=gpu",
        f"NodeName=n1 NodeAddr=127.0.0.1 {topo} Gres=gpu:{GPUS_PER_NODE} Weight=1 State=UNKNOWN",
        f"NodeName={EXTRA_NODES} NodeAddr=127.0.0.1 Port={_free_port()} {topo} Gres=gpu:{GPUS_PER_NODE} "
        "Weight=100 State=CLOUD",
        "PartitionName=debug Nodes=n[1-8] Default=YES MaxTime=INFINITE State=UP",
    ]
    conf.write_text("\n".join(lines) + "\n")
    (root / "gres.conf").write_text(f"AutoDetect=off\nNodeName=n[1-8] Name=gpu File={root / 'dev'}/gpu[0-{GPUS_PER_NODE - 1}]\n")
    return conf


class SlurmCluster:
    """munged + slurmctld + slurmd (node n1) with their files in `root`; start() then stop().

    Raises (start): ClusterUnavailable with the reason and the tail of the failing daemon's log.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def env(self) -> dict[str, str]:
        """The environment for sbatch/scontrol (and the jobs they start): this cluster's SLURM_CONF."""
        return dict(os.environ, SLURM_CONF=str(self.root / "slurm.conf"))

    def start(self) -> SlurmCluster:
        reason = why_unavailable()
        if reason:
            raise ClusterUnavailable(reason)
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)  # munged refuses a key or socket folder others may write to
        conf = write_config(self.root)
        key = self.root / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            os.chmod(key, 0o400)
        try:
            self._spawn("munged", ["-F", "--force", f"--key-file={key}", f"--socket={self.root / 'munge.socket'}",
                                   f"--pid-file={self.root / 'munged.pid'}", f"--log-file={self.root / 'munged.log'}",
                                   f"--seed-file={self.root / 'munged.seed'}"])
            self._wait("munged", lambda: (self.root / "munge.socket").exists())
            self._spawn("slurmctld", ["-D", "-i", "-f", str(conf)])
            self._wait("slurmctld", lambda: self._scontrol("ping").returncode == 0)
            self._spawn("slurmd", ["-D", "-N", "n1", "-f", str(conf)])
            self._wait("slurmd", lambda: "State=IDLE" in self._scontrol("show", "node", "n1").stdout)
        except BaseException:
            self.stop()
            raise
        (self.root / "pids").write_text("".join(f"{n} {p.pid}\n" for n, p in self.procs.items()))
        return self

    def _scontrol(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([_program("scontrol"), *args], capture_output=True, text=True, env=self.env, timeout=30)

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.root / f"{name}.out", "w")
        self.procs[name] = subprocess.Popen([_program(name), *args], stdout=log, stderr=subprocess.STDOUT,
                                            env=self.env, start_new_session=True)
        log.close()

    def _wait(self, name: str, ready) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            if self.procs[name].poll() is not None or time.monotonic() > deadline:
                state = (f"exited with status {self.procs[name].returncode}" if self.procs[name].poll() is not None
                         else f"not ready after {START_TIMEOUT_S} s")
                raise ClusterUnavailable(f"{name} {state}; its output ends: {self.log_tail(name)}")
            time.sleep(0.3)

    def log_tail(self, name: str, chars: int = 1500) -> str:
        """The end of daemon `name`'s output and log file (for a failure message)."""
        text = ""
        for f in (self.root / f"{name}.out", self.root / f"{name}.log"):
            if f.is_file():
                text += f.read_text(errors="replace")
        return text[-chars:]

    def stop(self) -> None:
        """Stop the daemons this object started, newest first, by pid (SIGTERM, then SIGKILL)."""
        for name in reversed(list(self.procs)):
            stop_pid(self.procs[name].pid, self.procs[name])
        self.procs.clear()


def stop_pid(pid: int, proc: subprocess.Popen | None = None, timeout_s: float = 15) -> None:
    """SIGTERM `pid`, wait up to `timeout_s`, then SIGKILL it (a gone process is no error)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return
        if proc is None:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
        time.sleep(0.2)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if proc is not None:
        proc.wait()


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(argv[1])
    if argv[0] == "start":
        try:
            SlurmCluster(root).start()
        except ClusterUnavailable as e:
            print(f"slurm cluster: {e}", file=sys.stderr)
            return 1
        print(f"export SLURM_CONF={root.resolve() / 'slurm.conf'}")
        return 0
    pids = root / "pids"
    for line in reversed(pids.read_text().splitlines() if pids.is_file() else []):
        stop_pid(int(line.split()[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
