"""Process group, device mesh and the collectives the training loop needs.

A run started by `torchrun` (environment RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) joins
the process group: NCCL when training on CUDA, gloo on the CPU. A run without a launcher stays a
single process; it still gets a one-process group when the layout needs one (ZeRO/FSDP2 on one
device, e.g. to offload to CPU memory).

The mesh has four named dimensions, outermost first, as in torchtitan:
`("pp", "dp_replicate", "dp_shard", "tp")`. Sizes of 1 are kept so every layout has the same
names. Flattened views: "dp" (dp_replicate x dp_shard; each dp rank reads its own slice of the
global batch and gradients are averaged over it) and "dp_shard" (the ZeRO/FSDP2 sharding group).
Tensor-parallel ranks sit innermost (adjacent ranks, i.e. the same node on a GPU cluster).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from gptforge.config import ParallelConfig

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "tp")


def launched_by_torchrun() -> bool:
    """True when the environment of a torchrun/torch.distributed.run worker is present."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def needs_process_group(pc: ParallelConfig) -> bool:
    """Does this layout use torch.distributed machinery even on one process?"""
    return pc.world_size > 1 or pc.zero_stage > 0 or pc.offload != "none"


@dataclass
class DistEnv:
    """Where this process sits in the job.

    rank/world_size: global; local_rank: on this node (picks the GPU). mesh: the 4-D DeviceMesh
    (None for a plain single-process run). dp_rank/dp_size: data-parallel coordinates (which slice
    of the global batch this rank reads). pp_rank/pp_size, tp_size likewise.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    mesh: Any = None
    dp_rank: int = 0
    dp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    tp_size: int = 1
    owns_group: bool = False
    dp_mesh: Any = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.mesh is not None

    def group(self, name: str):
        """The process group of mesh dimension `name` ("pp", "dp", "dp_shard", "tp", ...)."""
        if name == "dp":
            return self.dp_mesh.get_group()
        return self.mesh[name].get_group()

    # -- collectives used by the loop; all are no-ops on a single process ------------------

    def all_reduce_sum(self, values: list[float], group=None) -> list[float]:
        """Sum each value over `group` (default: all ranks), in float64. Returns plain floats."""
        if not self.distributed or self.world_size == 1:
            return [float(v) for v in values]
        t = torch.tensor(values, dtype=torch.float64, device=self._coll_device())
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        return t.tolist()

    def gather_stats(self, values: list[float]) -> list[list[float]]:
        """All ranks' `values`, as world_size rows (float64). Every rank gets every row."""
        if not self.distributed or self.world_size == 1:
            return [[float(v) for v in values]]
        t = torch.tensor(values, dtype=torch.float64, device=self._coll_device())
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(out, t)
        return [o.tolist() for o in out]

    def barrier(self) -> None:
        if self.distributed and self.world_size > 1:
            dist.barrier()

    def rank0_value(self, value: Any) -> Any:
        """Rank 0's `value` on every rank (a picklable object; `value` itself on one process).

        For choices every rank must make alike but each could measure differently, such as
        `train.precision auto` (a timing of this machine's matmuls): ranks that disagree would
        run collectives of different dtypes, which gloo aborts on ("Received data size doesn't
        match expected size") and NCCL may hang on."""
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _coll_device(self) -> torch.device:
        # NCCL only moves CUDA tensors; gloo only CPU ones.
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")


def resolve_device(name: str, local_rank: int) -> torch.device:
    """The device of this rank: `auto`/`cuda` -> cuda:LOCAL_RANK when CUDA exists, else CPU."""
    if name in ("auto", "cuda") and torch.cuda.is_available():
        return torch.device("cuda", local_rank)
    if name == "cuda":
        raise ValueError("train.device=cuda but CUDA is not available here; use auto or cpu")
    if name == "mps":
        raise ValueError("train.device=mps: torch.distributed has no MPS backend; use cpu")
    if name.startswith("cuda:"):
        return torch.device(name)
    return torch.device("cpu")


def init_distributed(pc: ParallelConfig, device_name: str = "auto", force_group: bool = False) -> DistEnv:
    """Join (or create) the process group and build the device mesh for layout `pc`.

    Under torchrun: rank/world size from the environment; backend nccl on CUDA, gloo on CPU.
    Without a launcher: a plain single-process DistEnv, or a one-process group (in-memory store)
    when the layout needs one (ZeRO/FSDP2/offload on one device) or `force_group` is set (the
    DeepSpeed engine always needs a process group).

    Raises:
        InputError: the layout does not match the number of processes (see ParallelConfig.validate).
    """
    if launched_by_torchrun():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
    else:
        rank, world, local_rank = 0, 1, 0
    pc.validate(world)
    device = resolve_device(device_name, local_rank)
    if world == 1 and not needs_process_group(pc) and not force_group and not dist.is_initialized():
        return DistEnv(device=device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    owns = False
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = datetime.timedelta(minutes=pc.timeout_minutes)
        if launched_by_torchrun():
            dist.init_process_group(backend=backend, timeout=timeout,
                                    device_id=device if device.type == "cuda" else None)
        else:
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1,
                                    timeout=timeout)
        owns = True
    from torch.distributed.device_mesh import init_device_mesh

    sizes = tuple(getattr(pc, d) for d in MESH_DIMS)
    mesh = init_device_mesh(device.type, sizes, mesh_dim_names=MESH_DIMS)
    dp_mesh = mesh["dp_replicate", "dp_shard"]._flatten("dp")
    return DistEnv(
        rank=rank, world_size=world, local_rank=local_rank, device=device, mesh=mesh, dp_mesh=dp_mesh,
        dp_rank=dp_mesh.get_local_rank(), dp_size=pc.dp, pp_rank=mesh["pp"].get_local_rank(),
        pp_size=pc.pp, tp_size=pc.tp, owns_group=owns,
    )


def shutdown(env: DistEnv) -> None:
    """Destroy the process group this module created (leave one made by the caller alone)."""
    if env.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def clip_grad_norm(params: list[torch.Tensor], max_norm: float, env: DistEnv) -> float:
    """Clip gradients to a global L2 norm of `max_norm`; return the norm before clipping.

    Works for plain tensors (single process, DDP: gradients identical on every rank), DTensors
    (FSDP2 and TP shards: local sums of squares are summed over the mesh dimensions the tensor
    is sharded on, one all-reduce per group of tensors sharded alike, not one per parameter) and
    pipeline stages (each stage holds different parameters: summed over the pp group). The result
    is the same on every rank, so skip decisions agree.
    """
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    buckets: dict[Any, list[torch.Tensor]] = {}
    meshes: dict[Any, Any] = {}
    for g in grads:
        key = None
        if isinstance(g, DTensor):
            if any(pl.is_partial() for pl in g.placements):
                g = g.redistribute(placements=[pl if not pl.is_partial() else _replicate() for pl in g.placements])
            dims = tuple(i for i, pl in enumerate(g.placements) if not pl.is_replicate())  # Shard, _StridedShard
            key = (id(g.device_mesh), dims)
            meshes[key] = g.device_mesh
            g = g.to_local()
        n = torch.linalg.vector_norm(g, dtype=torch.float32)
        buckets.setdefault(key, []).append(n.pow(2).to(env.device))
    total = torch.zeros((), dtype=torch.float32, device=env.device)
    for key, sqs in buckets.items():
        part = torch.stack(sqs).sum()
        if key is not None:
            mesh = meshes[key]
            for d in key[1]:
                dist.all_reduce(part, group=mesh.get_group(d))
        total = total + part
    if env.distributed and env.pp_size > 1:
        dist.all_reduce(total, group=env.group("pp"))
    norm = float(total.sqrt())
    if max_norm > 0 and norm > max_norm and grads:
        coef = max_norm / (norm + 1e-6)
        for g in grads:
            g.mul_(coef)
    return norm


def _replicate():
    from torch.distributed.tensor import Replicate

    return Replicate()
