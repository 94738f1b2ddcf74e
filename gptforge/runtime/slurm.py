"""Slurm batch scripts for multi-node training: one Slurm task per node runs torchrun, which starts
the node's processes; the first node of the allocation hosts a c10d rendezvous (GPU mode, or CPU
mode with `gpus_per_node=0` and `nproc_per_node=N` over gloo)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from gptforge.errors import InputError, OptionError

PARALLEL_DEGREES = ("dp_replicate", "dp_shard", "tp", "pp")


@dataclass
class SlurmJob:
    """One multi-node job: its Slurm resources and how torchrun starts on each node (the fields are
    `gptforge slurm`'s options)."""


    nodes: int
    """Number of nodes."""
    gpus_per_node: int
    """GPUs (and processes) per node; 0 for CPU nodes (then give --nproc-per-node)."""
    out: str
    """Where to write the script."""
    job_name: str = "gptforge"
    """Slurm job name."""
    time: str = "24:00:00"
    """Wall-clock limit, HH:MM:SS."""
    partition: Optional[str] = None
    """Slurm partition."""
    account: Optional[str] = None
    """Slurm account."""
    nproc_per_node: Optional[int] = None
    """Processes per node: default one per GPU; required with --gpus-per-node 0."""
    cpus_per_task: Optional[int] = None
    """CPU cores per node for the job (default: 8 per GPU; with --gpus-per-node 0, the whole node)."""
    port: int = 29500
    """Rendezvous port on the first node."""
    python: str = "python"
    """Python interpreter on the nodes."""
    setup: Optional[list[str]] = None
    """Shell lines to run before training (module load, source venv/bin/activate)."""


def _degree(cmd: list[str], name: str) -> int | None:
    flag = f"--parallel.{name}"
    for i, a in enumerate(cmd):
        if a == flag and i + 1 < len(cmd):
            return int(cmd[i + 1])
        if a.startswith(flag + "="):
            return int(a.split("=", 1)[1])
    return None


def check_world_size(cmd: list[str], world: int, unit: str = "GPUs") -> None:
    """The command's parallel degrees (a degree left out or -1 fills the rest, as in the trainer)
    must use exactly nodes x processes-per-node processes (a mismatch would only fail after the
    job waited in the queue). `unit` names them in the message (GPUs, or processes in CPU mode).

    Raises:
        OptionError: the layout does not fill the job, naming both.
    """
    from gptforge.config import ParallelConfig

    given: dict[str, Any] = {n: _degree(cmd, n) for n in PARALLEL_DEGREES}
    pc = ParallelConfig(**{n: v for n, v in given.items() if v is not None})
    shown = " x ".join(f"{n} {getattr(pc, n)}" for n in PARALLEL_DEGREES)
    try:
        pc = pc.resolved(world)
    except InputError as e:
        raise OptionError(f"the command's layout ({shown}) does not fit the {world} {unit} of the job: {e}") from None
    if pc.world_size != world:
        raise OptionError(f"the command's layout ({shown} = {pc.world_size}) does not use the {world} {unit} of the "
                         "job (nodes x processes per node)")


def processes_per_node(args: SlurmJob) -> int:
    """Processes torchrun starts on each node: one per GPU, or --nproc-per-node in CPU mode.

    Raises:
        OptionError: a count below its minimum, CPU mode without --nproc-per-node, or a GPU mode
            --nproc-per-node other than --gpus-per-node (one process drives one GPU).
    """
    if args.nodes < 1 or args.gpus_per_node < 0:
        raise OptionError("--nodes must be >= 1 and --gpus-per-node >= 0 (0: CPU nodes)")
    if args.nproc_per_node is not None and args.nproc_per_node < 1:
        raise OptionError(f"--nproc-per-node must be >= 1 (got {args.nproc_per_node})")
    if args.gpus_per_node == 0:
        if args.nproc_per_node is None:
            raise OptionError("--gpus-per-node 0 (CPU nodes) needs --nproc-per-node N: the processes per node")
        return args.nproc_per_node
    if args.nproc_per_node not in (None, args.gpus_per_node):
        raise OptionError(f"--nproc-per-node {args.nproc_per_node} with --gpus-per-node {args.gpus_per_node}: "
                         "each process drives one GPU; leave --nproc-per-node out, or use --gpus-per-node 0 "
                         "for CPU nodes")
    return args.gpus_per_node


def _resource_lines(args: SlurmJob) -> list[str]:
    """#SBATCH lines for the nodes' GPUs and CPUs. CPU mode without --cpus-per-task takes whole
    nodes (--exclusive), so SLURM_CPUS_ON_NODE is every CPU the node has."""
    lines = [f"#SBATCH --job-name={args.job_name}", f"#SBATCH --nodes={args.nodes}", "#SBATCH --ntasks-per-node=1"]
    if args.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={args.gpus_per_node}")
        lines.append(f"#SBATCH --cpus-per-task={args.cpus_per_task or 8 * args.gpus_per_node}")
    elif args.cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={args.cpus_per_task}")
    else:
        lines.append("#SBATCH --exclusive")
    lines += [f"#SBATCH --time={args.time}", "#SBATCH --output=%x-%j.out"]
    if args.partition:
        lines.append(f"#SBATCH --partition={args.partition}")
    if args.account:
        lines.append(f"#SBATCH --account={args.account}")
    return lines


NCCL_LINES = [
    "# Fail loudly instead of hanging: a collective that waits longer than",
    "# parallel.timeout_minutes aborts the job, and each rank dumps its recent collectives",
    "# (the flight recorder) so the rank that fell behind can be found.",
    "export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}",
    "export TORCH_NCCL_TRACE_BUFFER_SIZE=${TORCH_NCCL_TRACE_BUFFER_SIZE:-2000}",
    "export TORCH_NCCL_DUMP_ON_TIMEOUT=${TORCH_NCCL_DUMP_ON_TIMEOUT:-1}",
    'export TORCH_FR_DUMP_TEMP_FILE=${TORCH_FR_DUMP_TEMP_FILE:-$PWD/nccl_trace_${SLURM_JOB_ID}_rank_}',
    "export NCCL_DEBUG=${NCCL_DEBUG:-WARN}",
    "# On clusters with several network interfaces, name the fast one, e.g.:",
    "# export NCCL_SOCKET_IFNAME=ib0        # or eth0, ens; see `ip addr`",
    "# export NCCL_IB_HCA=mlx5             # InfiniBand adapters to use",
]
GLOO_LINES = [
    "# CPU nodes: the processes talk over gloo. On nodes with several network interfaces, name",
    "# the one the nodes reach each other on, e.g.:",
    "# export GLOO_SOCKET_IFNAME=eth0       # see `ip addr`",
]


def render(args: SlurmJob, cmd: list[str]) -> str:
    """The sbatch script text (see the module docstring); `cmd` is the gptforge command it runs."""
    nproc = processes_per_node(args)
    lines = [
        "#!/bin/bash",
        *_resource_lines(args),
        "# Written by `gptforge slurm`. Submit with: sbatch " + shlex.quote(Path(args.out).name),
        "set -euo pipefail",
        "",
        *args.setup,
        "",
        "# The first node of the allocation hosts the rendezvous, at the address Slurm reaches it by",
        "# (NodeAddr; the same as its name unless slurm.conf says otherwise).",
        'FIRST_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'MASTER_ADDR=$(scontrol show node "$FIRST_NODE" | sed -n \'s/.*NodeAddr=\\([^ ]*\\).*/\\1/p\')',
        'MASTER_ADDR=${MASTER_ADDR:-$FIRST_NODE}',
        f"MASTER_PORT={args.port}",
        "",
        *(NCCL_LINES if args.gpus_per_node else GLOO_LINES),
        "",
        "# The CPUs of this node's task, shared between its processes. srun is given them",
        "# explicitly: since Slurm 22.05 a step no longer inherits the batch job's --cpus-per-task.",
        "CPUS=${SLURM_CPUS_PER_TASK:-$SLURM_CPUS_ON_NODE}",
        f"NPROC={nproc}",
        "export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( CPUS / NPROC > 0 ? CPUS / NPROC : 1 ))}",
        "",
        'srun --kill-on-bad-exit=1 --cpus-per-task="$CPUS" ' + shlex.join([
            args.python, "-m", "torch.distributed.run",
            "--nnodes", str(args.nodes), "--nproc-per-node", str(nproc),
            "--rdzv-backend", "c10d",
        ]) + ' --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "$SLURM_JOB_ID" \\',
        "    " + shlex.join(["-m", "gptforge.cli", *cmd]),
        "",
    ]
    return "\n".join(lines)


