"""torchrun (torch.distributed.run) command lines and environments for gptforge commands, on one
node or several (c10d or static rendezvous), with restarts."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Optional

from gptforge.errors import OptionError


@dataclass
class LaunchOptions:
    """How torchrun starts a gptforge command (the fields are `gptforge launch`'s options)."""

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


def nproc(value: str) -> int:
    """Processes per node from --nproc-per-node (a count, or `gpu`)."""
    if value == "gpu":
        import torch

        return max(1, torch.cuda.device_count())
    try:
        n = int(value)
    except ValueError:
        raise OptionError(f"--nproc-per-node {value!r}: give a number or gpu") from None
    if n < 1:
        raise OptionError(f"--nproc-per-node must be >= 1 (got {n})")
    return n


def torchrun_command(args: LaunchOptions) -> list[str]:
    """The torch.distributed.run command line for these options (a list of arguments).

    Raises:
        OptionError: no gptforge command given, several nodes without --rdzv-endpoint, or the
            command's --parallel.* layout does not fill nnodes x nproc-per-node processes.
    """
    from gptforge.runtime.slurm import check_world_size

    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise OptionError("no command given: e.g. gptforge launch --nproc-per-node 2 pretrain --data DIR --out RUN")
    if cmd[0] == "launch":
        raise OptionError("gptforge launch cannot launch itself")
    check_world_size(cmd[1:], args.nnodes * nproc(args.nproc_per_node), "processes")
    out = [sys.executable, "-m", "torch.distributed.run"]
    if args.nnodes == 1 and args.rdzv_endpoint is None:
        out += ["--standalone"]
    elif args.rdzv_endpoint is None:
        raise OptionError(f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (a host every node can reach)")
    else:
        out += ["--rdzv-backend", args.rdzv_backend, "--rdzv-endpoint", args.rdzv_endpoint, "--rdzv-id", args.rdzv_id]
        if args.node_rank is not None:
            out += ["--node-rank", str(args.node_rank)]
    out += ["--nnodes", str(args.nnodes), "--nproc-per-node", str(nproc(args.nproc_per_node))]
    if args.max_restarts:
        out += ["--max-restarts", str(args.max_restarts)]
    return out + ["-m", "gptforge.cli", *cmd]



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
