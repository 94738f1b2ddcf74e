"""`gptforge launch [--nproc-per-node N] [multi-node options] COMMAND ...`: run a gptforge command
under torchrun (torch.distributed.run), printing the exact command line first."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Optional

from gptforge.errors import InputError
from gptforge.options import command_parser, parse_command

DESCRIPTION = """Start N processes per node with torchrun, each running `gptforge COMMAND ...`.

One node:      gptforge launch --nproc-per-node 8 pretrain --data DIR --out RUN --parallel.dp_shard 8
Several nodes: run on every node, with the same --rdzv-endpoint (host:port of one of them):
               gptforge launch --nnodes 4 --nproc-per-node 8 --rdzv-endpoint node0:29500 --rdzv-id job1 pretrain ...
On Slurm, `gptforge slurm` writes the batch script that does this. The command is printed before
it runs, so it can be copied into a script of your own. launch's own options count wherever they
stand (`gptforge launch pretrain ... --dry-run` only prints); everything after a `--` goes to
the command unread."""


ERROR_EXIT = 2  # exit status of a refused launch


@dataclass
class LaunchOptions:
    nproc_per_node: str = "gpu"
    """Processes per node: a number, or gpu (one per visible GPU; 1 without CUDA)."""
    nnodes: int = 1
    """Number of nodes."""
    node_rank: Optional[int] = None
    """This node's rank; only with static rendezvous (--rdzv-backend static)."""
    rdzv_endpoint: Optional[str] = None
    """host:port every node can reach (multi-node). Without it on one node: --standalone."""
    rdzv_id: str = "gptforge"
    """Job id shared by all nodes."""
    rdzv_backend: str = "c10d"
    """Rendezvous backend: c10d or static."""
    max_restarts: int = 0
    """Restart the worker group this often on failure."""
    dry_run: bool = False
    """Print the command and exit without running it."""
    command: list[str] = field(default_factory=list)
    """The gptforge command and its options, e.g. pretrain ... (launch's own options may stand anywhere)."""


def build_parser():
    return command_parser("gptforge launch", DESCRIPTION, LaunchOptions, positional=("command",))


def split_launch_options(parser, argv: list[str]) -> LaunchOptions:
    """Parse `argv`, taking launch's own options wherever they stand, up to a `--`.

    Without this, an option after the command name (`launch pretrain ... --dry-run`) went to
    the command, and a dry run started real processes. Tokens after the first `--` belong to
    the command verbatim (for an option of the command that shares a name with launch's).

    Returns the namespace with `command` the gptforge command and its own arguments.
    Raises SystemExit(2), after a `gptforge launch: error:` line, for a launch option missing its value.
    """
    takes_value = {}
    for action in parser._actions:  # argparse's own table of the options (jsonargparse keeps it)
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
                    print(f"gptforge launch: error: argument {name}: expected a value", file=sys.stderr)
                    raise SystemExit(2)
                own.append(argv[i + 1])
                i += 1
        elif tok in ("-h", "--help") and not command:
            own.append(tok)
        else:
            command.append(tok)
        i += 1
    args, _ = parse_command(parser, own)
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
        raise InputError(f"--nproc-per-node {value!r}: give a number or gpu") from None
    if n < 1:
        raise InputError(f"--nproc-per-node must be >= 1 (got {n})")
    return n


def torchrun_command(args: LaunchOptions) -> list[str]:
    """The torch.distributed.run command line for these options (a list of arguments).

    Raises:
        InputError: no gptforge command given, or several nodes without --rdzv-endpoint.
    """
    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise InputError("no command given: e.g. gptforge launch --nproc-per-node 2 pretrain --data DIR --out RUN")
    if cmd[0] == "launch":
        raise InputError("gptforge launch cannot launch itself")
    out = [sys.executable, "-m", "torch.distributed.run"]
    if args.nnodes == 1 and args.rdzv_endpoint is None:
        out += ["--standalone"]
    elif args.rdzv_endpoint is None:
        raise InputError(f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (a host every node can reach)")
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
    cmd = torchrun_command(args)
    print(shlex.join(cmd), flush=True)
    if args.dry_run:
        return 0
    return subprocess.call(cmd, env=launch_env(args, os.environ))


def launch_env(args: LaunchOptions, environ) -> dict[str, str]:
    """The environment torchrun runs under: `environ` plus gptforge's defaults (a variable
    already set is kept).

    OMP_NUM_THREADS=1: N ranks of all-core BLAS oversubscribe the CPU. With --max-restarts,
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: when the workers share the agent's rendezvous store
    (torch's default), a restarted group can read the keys of the failed one, e.g. a dead rank's
    gloo or NCCL address, and fail to connect ("Connection refused"; pytorch/pytorch#135712,
    #167288). Unshared, every attempt's rank 0 hosts a fresh store.
    """
    env = dict(environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    if args.max_restarts:
        env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    return env
