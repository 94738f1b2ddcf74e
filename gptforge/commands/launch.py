"""`gptforge launch [--nproc-per-node N] [multi-node options] COMMAND ...`: run a gptforge command
under torchrun (torch.distributed.run), printing the exact command line first."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys

DESCRIPTION = """Start N processes per node with torchrun, each running `gptforge COMMAND ...`.

One node:      gptforge launch --nproc-per-node 8 pretrain --data DIR --out RUN --parallel.dp_shard 8
Several nodes: run on every node, with the same --rdzv-endpoint (host:port of one of them):
               gptforge launch --nnodes 4 --nproc-per-node 8 --rdzv-endpoint node0:29500 --rdzv-id job1 pretrain ...
On Slurm, `gptforge slurm` writes the batch script that does this. The command is printed before
it runs, so it can be copied into a script of your own. launch's own options count wherever they
stand (`gptforge launch pretrain ... --dry-run` only prints); everything after a `--` goes to
the command unread."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gptforge launch", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc-per-node", default="gpu",
                   help="Processes per node: a number, or gpu (one per visible GPU; 1 without CUDA). Default gpu.")
    p.add_argument("--nnodes", type=int, default=1, help="Number of nodes (default 1).")
    p.add_argument("--node-rank", type=int, default=None,
                   help="This node's rank; only with static rendezvous (--rdzv-backend static).")
    p.add_argument("--rdzv-endpoint", default=None,
                   help="host:port every node can reach (multi-node). Without it on one node: --standalone.")
    p.add_argument("--rdzv-id", default="gptforge", help="Job id shared by all nodes (default gptforge).")
    p.add_argument("--rdzv-backend", default="c10d", help="Rendezvous backend: c10d (default) or static.")
    p.add_argument("--max-restarts", type=int, default=0, help="Restart the worker group this often on failure.")
    p.add_argument("--dry-run", action="store_true", help="Print the command and exit without running it.")
    p.add_argument("command", nargs=argparse.REMAINDER, help="gptforge command and its options, e.g. pretrain ...")
    return p


def split_launch_options(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse `argv`, taking launch's own options wherever they stand, up to a `--`.

    Without this, an option after the command name (`launch pretrain ... --dry-run`) went to
    the command, and a dry run started real processes. Tokens after the first `--` belong to
    the command verbatim (for an option of the command that shares a name with launch's).

    Returns the namespace with `command` the gptforge command and its own arguments.
    Raises SystemExit(2) through `parser.error` for a launch option missing its value.
    """
    takes_value = {}
    for action in parser._actions:
        for opt in action.option_strings:
            if opt not in ("-h", "--help"):
                takes_value[opt] = action.nargs != 0
    own: list[str] = []
    command: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            command += argv[i + 1:]
            break
        name = tok.split("=", 1)[0]
        if name in takes_value:
            own.append(tok)
            if takes_value[name] and "=" not in tok:
                if i + 1 >= len(argv):
                    parser.error(f"argument {name}: expected a value")
                own.append(argv[i + 1])
                i += 1
        elif tok in ("-h", "--help") and not command:
            own.append(tok)
        else:
            command.append(tok)
        i += 1
    args = parser.parse_args(own)
    args.command = command
    return args


def nproc(value: str) -> int:
    """Processes per node from --nproc-per-node (a count, or `gpu`)."""
    if value == "gpu":
        import torch

        return max(1, torch.cuda.device_count())
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"--nproc-per-node {value!r}: give a number or gpu") from None
    if n < 1:
        raise ValueError(f"--nproc-per-node must be >= 1 (got {n})")
    return n


def torchrun_command(args: argparse.Namespace) -> list[str]:
    """The torch.distributed.run command line for these options (a list of arguments).

    Raises:
        ValueError: no gptforge command given, or several nodes without --rdzv-endpoint.
    """
    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ValueError("no command given: e.g. gptforge launch --nproc-per-node 2 pretrain --data DIR --out RUN")
    if cmd[0] == "launch":
        raise ValueError("gptforge launch cannot launch itself")
    out = [sys.executable, "-m", "torch.distributed.run"]
    if args.nnodes == 1 and args.rdzv_endpoint is None:
        out += ["--standalone"]
    elif args.rdzv_endpoint is None:
        raise ValueError(f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (a host every node can reach)")
    else:
        out += ["--rdzv-backend", args.rdzv_backend, "--rdzv-endpoint", args.rdzv_endpoint, "--rdzv-id", args.rdzv_id]
        if args.node_rank is not None:
            out += ["--node-rank", str(args.node_rank)]
    out += ["--nnodes", str(args.nnodes), "--nproc-per-node", str(nproc(args.nproc_per_node))]
    if args.max_restarts:
        out += ["--max-restarts", str(args.max_restarts)]
    return out + ["-m", "gptforge.cli", *cmd]


def main(argv: list[str]) -> int:
    args = split_launch_options(build_parser(), argv)
    try:
        cmd = torchrun_command(args)
    except ValueError as e:
        print(f"gptforge launch: error: {e}", file=sys.stderr)
        return 2
    print(shlex.join(cmd), flush=True)
    if args.dry_run:
        return 0
    env = dict(os.environ)
    # One thread per rank unless asked otherwise: N ranks of all-core BLAS oversubscribe the CPU.
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.call(cmd, env=env)
