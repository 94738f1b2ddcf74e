"""`gptforge slurm --nodes N --gpus-per-node G [...] -- pretrain ...`: write an sbatch script that
starts torchrun on every node with a c10d rendezvous on the first node."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from gptforge.errors import InputError
from gptforge.options import command_parser, parse_command

DESCRIPTION = """Write a Slurm batch script for N nodes x G GPUs running a gptforge command.

    gptforge slurm --nodes 4 --gpus-per-node 8 --out train.sbatch -- pretrain --data DIR --out RUN \\
        --parallel.dp_shard 32
    sbatch train.sbatch

One Slurm task per node runs torchrun, which starts G processes; the first node of the
allocation hosts the rendezvous. The script sets the NCCL/PyTorch variables for clear failures
instead of silent hangs (see docs/distributed.md)."""

PARALLEL_DEGREES = ("dp_replicate", "dp_shard", "tp", "pp")


ERROR_EXIT = 2  # exit status of a refused script


@dataclass
class SlurmOptions:
    nodes: int
    """Number of nodes."""
    gpus_per_node: int
    """GPUs (and processes) per node."""
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
    cpus_per_task: Optional[int] = None
    """CPU cores per node for the job (default: 8 per GPU)."""
    port: int = 29500
    """Rendezvous port on the first node."""
    python: str = "python"
    """Python interpreter on the nodes."""
    setup: Optional[list[str]] = None
    """Shell lines to run before training (module load, source venv/bin/activate)."""


def build_parser():
    return command_parser("gptforge slurm", DESCRIPTION, SlurmOptions)


def _degree(cmd: list[str], name: str) -> int | None:
    flag = f"--parallel.{name}"
    for i, a in enumerate(cmd):
        if a == flag and i + 1 < len(cmd):
            return int(cmd[i + 1])
        if a.startswith(flag + "="):
            return int(a.split("=", 1)[1])
    return None


def check_world_size(cmd: list[str], world: int) -> None:
    """The command's parallel degrees (a degree left out or -1 fills the rest, as in the trainer)
    must use exactly nodes x GPUs processes (a mismatch would only fail after the job waited in
    the queue).

    Raises:
        InputError: the layout does not fill the job, naming both.
    """
    from gptforge.config import ParallelConfig

    given: dict[str, Any] = {n: _degree(cmd, n) for n in PARALLEL_DEGREES}
    pc = ParallelConfig(**{n: v for n, v in given.items() if v is not None})
    shown = " x ".join(f"{n} {getattr(pc, n)}" for n in PARALLEL_DEGREES)
    try:
        pc = pc.resolved(world)
    except InputError as e:
        raise InputError(f"the command's layout ({shown}) does not fit the {world} GPUs of the job: {e}") from None
    if pc.world_size != world:
        raise InputError(f"the command's layout ({shown} = {pc.world_size}) does not use the {world} GPUs of the "
                         "job (nodes x gpus-per-node)")


def render(args: SlurmOptions, cmd: list[str]) -> str:
    """The sbatch script text."""
    cpus = args.cpus_per_task or 8 * args.gpus_per_node
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={args.job_name}",
        f"#SBATCH --nodes={args.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={args.gpus_per_node}",
        f"#SBATCH --cpus-per-task={cpus}",
        f"#SBATCH --time={args.time}",
        "#SBATCH --output=%x-%j.out",
    ]
    if args.partition:
        lines.append(f"#SBATCH --partition={args.partition}")
    if args.account:
        lines.append(f"#SBATCH --account={args.account}")
    lines += [
        "# Written by `gptforge slurm`. Submit with: sbatch " + shlex.quote(Path(args.out).name),
        "set -euo pipefail",
        "",
        *args.setup,
        "",
        "# The first node of the allocation hosts the rendezvous.",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"MASTER_PORT={args.port}",
        "",
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
        f"export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-{max(1, cpus // args.gpus_per_node)}}}",
        "",
        "srun --kill-on-bad-exit=1 " + shlex.join([
            args.python, "-m", "torch.distributed.run",
            "--nnodes", str(args.nodes), "--nproc-per-node", str(args.gpus_per_node),
            "--rdzv-backend", "c10d",
        ]) + ' --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "$SLURM_JOB_ID" \\',
        "    " + shlex.join(["-m", "gptforge.cli", *cmd]),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if "--" in argv:  # everything after -- is the gptforge command the job runs
        cut = argv.index("--")
        argv, cmd = argv[:cut], argv[cut + 1:]
    else:
        cmd = []
    args, _ = parse_command(build_parser(), argv)
    args.setup = args.setup or []
    if args.nodes < 1 or args.gpus_per_node < 1:
        raise InputError("--nodes and --gpus-per-node must be >= 1")
    if not cmd:
        raise InputError("no command given: add `-- pretrain --data DIR --out RUN ...`")
    check_world_size(cmd, args.nodes * args.gpus_per_node)
    from gptforge.atomic import atomic_write_text

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, render(args, cmd))
    os.chmod(out, 0o755)
    print(f"wrote {out}: {args.nodes} nodes x {args.gpus_per_node} GPUs; submit with `sbatch {out}`")
    return 0
