"""`gptforge slurm --nodes N --gpus-per-node G [...] -- pretrain ...`: write an sbatch script that
starts torchrun on every node with a c10d rendezvous on the first node (GPU mode, or CPU mode with
`--gpus-per-node 0 --nproc-per-node N`); the script is built by `gptforge.runtime.slurm`."""

from __future__ import annotations

import os
from pathlib import Path

from gptforge.errors import OptionError
from gptforge.options import command_parser, parse_command
from gptforge.runtime.slurm import SlurmJob, check_world_size, processes_per_node, render

# One description: `gptforge --help` lists SUMMARY (read from this file unimported); DESCRIPTION begins with it.
SUMMARY = "Write a Slurm batch script for N nodes x G GPUs running a gptforge command."

DESCRIPTION = SUMMARY + """

    gptforge slurm --nodes 4 --gpus-per-node 8 --out train.sbatch -- pretrain --data DIR --out RUN \\
        --parallel.dp_shard 32
    sbatch train.sbatch

One Slurm task per node runs torchrun, which starts G processes; the first node of the
allocation hosts the rendezvous. The script sets the NCCL/PyTorch variables for clear failures
instead of silent hangs (see docs/distributed.md). CPU mode (`--gpus-per-node 0
--nproc-per-node N`) asks for no GPUs, takes whole nodes (or --cpus-per-task) and splits the
node's CPUs between the N processes (gloo); see docs/scale-out.md."""


def build_parser():
    return command_parser("gptforge slurm", DESCRIPTION, SlurmJob)


def main(argv: list[str]) -> int:
    if "--" in argv:  # everything after -- is the gptforge command the job runs
        cut = argv.index("--")
        argv, cmd = argv[:cut], argv[cut + 1:]
    else:
        cmd = []
    args, _ = parse_command(build_parser(), argv)
    args.setup = args.setup or []
    nproc = processes_per_node(args)
    if not cmd:
        raise OptionError("no command given: add `-- pretrain --data DIR --out RUN ...`")
    check_world_size(cmd, args.nodes * nproc, "GPUs" if args.gpus_per_node else "processes")
    from gptforge.cli import check_command

    check_command(cmd, "slurm")
    from gptforge.atomic import atomic_write_text

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, render(args, cmd))
    os.chmod(out, 0o755)
    what = f"{args.gpus_per_node} GPUs" if args.gpus_per_node else f"{nproc} CPU processes"
    print(f"wrote {out}: {args.nodes} nodes x {what}; submit with `sbatch {out}`")
    return 0
