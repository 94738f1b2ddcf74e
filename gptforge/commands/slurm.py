"""`gptforge slurm --nodes N --gpus-per-node G [...] -- pretrain ...`: write an sbatch script that
starts torchrun on every node with a c10d rendezvous on the first node."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

DESCRIPTION = """Write a Slurm batch script for N nodes x G GPUs running a gptforge command.

    gptforge slurm --nodes 4 --gpus-per-node 8 --out train.sbatch -- pretrain --data DIR --out RUN \\
        --parallel.dp_shard 32
    sbatch train.sbatch

One Slurm task per node runs torchrun, which starts G processes; the first node of the
allocation hosts the rendezvous. The script sets the NCCL/PyTorch variables for clear failures
instead of silent hangs (see docs/distributed.md)."""

PARALLEL_DEGREES = ("dp_replicate", "dp_shard", "tp", "pp")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gptforge slurm", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, required=True, help="Number of nodes.")
    p.add_argument("--gpus-per-node", type=int, required=True, help="GPUs (and processes) per node.")
    p.add_argument("--job-name", default="gptforge", help="Slurm job name (default gptforge).")
    p.add_argument("--time", default="24:00:00", help="Wall-clock limit, HH:MM:SS (default 24:00:00).")
    p.add_argument("--partition", default=None, help="Slurm partition.")
    p.add_argument("--account", default=None, help="Slurm account.")
    p.add_argument("--cpus-per-task", type=int, default=None,
                   help="CPU cores per node for the job (default: 8 per GPU).")
    p.add_argument("--port", type=int, default=29500, help="Rendezvous port on the first node (default 29500).")
    p.add_argument("--python", default="python", help="Python interpreter on the nodes (default python).")
    p.add_argument("--setup", action="append", default=[],
                   help="A shell line to run before training (module load, source venv/bin/activate); repeatable.")
    p.add_argument("--out", required=True, help="Where to write the script.")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the gptforge command, e.g. pretrain ...")
    return p


def _degree(cmd: list[str], name: str) -> int | None:
    flag = f"--parallel.{name}"
    for i, a in enumerate(cmd):
        if a == flag and i + 1 < len(cmd):
            return int(cmd[i + 1])
        if a.startswith(flag + "="):
            return int(a.split("=", 1)[1])
    return None


def check_world_size(cmd: list[str], world: int) -> None:
    """When the command sets parallel degrees on its command line, their product must be nodes x
    GPUs (a mismatch would only fail after the job waited in the queue).

    Raises:
        ValueError: the product differs, naming both.
    """
    degrees = {n: _degree(cmd, n) for n in PARALLEL_DEGREES}
    if all(v is None for v in degrees.values()):
        return
    prod = 1
    for v in degrees.values():
        prod *= v or 1
    if prod != world:
        shown = " x ".join(f"{n} {v or 1}" for n, v in degrees.items())
        raise ValueError(f"the command's layout ({shown} = {prod}) does not use the {world} GPUs of the job "
                         "(nodes x gpus-per-node)")


def render(args: argparse.Namespace, cmd: list[str]) -> str:
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
    args = build_parser().parse_args(argv)
    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    try:
        if args.nodes < 1 or args.gpus_per_node < 1:
            raise ValueError("--nodes and --gpus-per-node must be >= 1")
        if not cmd:
            raise ValueError("no command given: add `-- pretrain --data DIR --out RUN ...`")
        check_world_size(cmd, args.nodes * args.gpus_per_node)
    except ValueError as e:
        print(f"gptforge slurm: error: {e}", file=sys.stderr)
        return 2
    from gptforge.atomic import atomic_write_text

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, render(args, cmd))
    os.chmod(out, 0o755)
    print(f"wrote {out}: {args.nodes} nodes x {args.gpus_per_node} GPUs; submit with `sbatch {out}`")
    return 0
