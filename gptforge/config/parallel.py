"""The parallel section (`parallel.*`): how a job is laid out over devices."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal, Optional

# Where FSDP2 offloads model states (a config field and the layout search share it).
Offload = Literal["none", "optimizer", "optimizer+params"]


@dataclass
class ParallelConfig:
    """How the job is laid out over devices (see docs/distributed.md).

    The product dp_replicate * dp_shard * tp * pp must equal the number of processes torchrun
    starts. ZeRO stages map to PyTorch mechanisms: 1 = DDP + ZeroRedundancyOptimizer, 2 = FSDP2
    with reshard_after_forward=False, 3 = FSDP2 full sharding (the default when dp_shard > 1).
    """

    dp_replicate: int = 1
    """Data-parallel replicas (DDP, or HSDP's replicate dimension)."""
    dp_shard: int = -1
    """Data-parallel shards (FSDP2 / ZeRO). -1 (the default): the processes not used by the other
    degrees, so a run on N processes with no parallel flags is FSDP2 over N (1 process: 1)."""
    tp: int = 1
    """Tensor-parallel degree."""
    pp: int = 1
    """Pipeline-parallel stages."""
    pp_schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] = "1f1b"
    """Pipeline schedule."""
    pp_microbatches: int = 0
    """Pipeline micro-batches per step (0: gradient_accumulation_steps, at least pp)."""
    zero_stage: int = 0
    """ZeRO stage over the data-parallel ranks: 1 optimizer states sharded (DDP +
    ZeroRedundancyOptimizer), 2 + gradients sharded (FSDP2, reshard_after_forward=False), 3 +
    parameters sharded (FSDP2 full sharding). 0: 3 when dp_shard > 1, else none (DDP when
    dp_replicate > 1)."""
    offload: Offload = "none"
    """Offload model states to CPU memory through FSDP2's CPUOffloadPolicy (needs zero_stage 2 or
    3). FSDP2 offloads sharded parameters, gradients and the optimizer step together, so
    `optimizer` and `optimizer+params` both do that; pinned memory only with CUDA."""
    timeout_minutes: int = 10
    """Timeout of collectives: a rank waiting longer than this for the others fails with an
    error instead of hanging forever (see docs/distributed.md, hangs)."""
    backend: Literal["torch", "deepspeed"] = "torch"
    """Training engine: torch (DDP/FSDP2/TP/PP, the default) or deepspeed (needs
    `pip install gptforge[deepspeed]` and parallel.deepspeed_config)."""
    deepspeed_config: Optional[str] = None
    """DeepSpeed JSON config (backend deepspeed). Keys it shares with gptforge's config must agree
    with values set here, or the run stops with an error naming both."""

    DEGREES = ("dp_replicate", "dp_shard", "tp", "pp")

    @property
    def dp(self) -> int:
        """Data-parallel ranks (dp_replicate * dp_shard); needs resolved degrees."""
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        """Processes the layout uses (dp * tp * pp); needs resolved degrees."""
        return self.dp * self.tp * self.pp

    def resolved(self, world_size: int) -> "ParallelConfig":
        """The layout on `world_size` processes: a degree of -1 takes the processes the others
        leave (torchtitan's rule); at most one degree may be -1.

        Raises:
            InputError: more than one -1, a degree < -1 or 0, or a world size the fixed degrees
                do not divide.
        """
        from gptforge.errors import InputError

        free = [n for n in self.DEGREES if getattr(self, n) == -1]
        for n in self.DEGREES:
            if getattr(self, n) < 1 and getattr(self, n) != -1:
                raise InputError(f"parallel.{n} must be >= 1, or -1 for the rest of the processes (got "
                                 f"{getattr(self, n)})")
        if not free:
            return self
        if len(free) > 1:
            raise InputError(f"only one parallel degree may be -1 (the rest of the processes); got {', '.join(free)}")
        fixed = math.prod(getattr(self, n) for n in self.DEGREES if n != free[0])
        if world_size % fixed:
            raise InputError(f"{world_size} processes are not divisible by the fixed parallel degrees "
                             f"({' x '.join(f'{n} {getattr(self, n)}' for n in self.DEGREES if n != free[0])} = "
                             f"{fixed}); change them or the number of processes")
        return dataclasses.replace(self, **{free[0]: world_size // fixed})

    def effective_zero_stage(self) -> int:
        """zero_stage as run and planned: an explicit 1/2/3, else 3 (FSDP2 full sharding) when
        dp_shard > 1, else 0. Raises InputError for a stage outside 0-3."""
        from gptforge.errors import InputError

        if self.zero_stage not in (0, 1, 2, 3):
            raise InputError(f"parallel.zero_stage must be 0, 1, 2 or 3 (got {self.zero_stage})")
        if self.zero_stage:
            return self.zero_stage
        return 3 if self.dp_shard > 1 else 0

    def uses_fsdp(self) -> bool:
        """FSDP2 `fully_shard` over dp_shard (HSDP when dp_replicate > 1 too): ZeRO-2 and ZeRO-3."""
        return self.effective_zero_stage() in (2, 3)

    def uses_ddp(self) -> bool:
        """DistributedDataParallel: replicated data parallelism, and ZeRO-1's gradient all-reduce."""
        z = self.effective_zero_stage()
        return z == 1 or (z == 0 and self.dp_replicate > 1)

    def shard_degree(self) -> int:
        """Ranks model states are sharded over: dp_shard (FSDP2/HSDP), else the whole dp group."""
        return self.dp_shard if self.dp_shard > 1 else self.dp

    def validate(self, world_size: int | None = None) -> None:
        """Check that the (resolved) layout's parts can be combined and, given `world_size`, that
        it uses exactly that many processes. The planner and the trainer both call this.

        Raises:
            InputError: naming the field and what to do instead.
        """
        from gptforge.errors import InputError

        if world_size is None:  # the planner's view: a degree of -1 is 1
            world_size_fill = math.prod(max(getattr(self, n), 1) for n in self.DEGREES)
            self = self.resolved(world_size_fill)
        else:
            self = self.resolved(world_size)
        if world_size is not None and self.world_size != world_size:
            how = ("launch with `gptforge launch --nproc-per-node N pretrain ...` or torchrun"
                   if world_size == 1 else "change the parallel.* degrees or the number of processes")
            raise InputError(
                f"parallel layout dp_replicate {self.dp_replicate} x dp_shard {self.dp_shard} x tp {self.tp} x pp "
                f"{self.pp} = {self.world_size} processes, but this job has {world_size}; {how}"
            )
        stage = self.effective_zero_stage()
        if self.zero_stage == 1 and (self.tp > 1 or self.pp > 1):
            raise InputError("parallel.zero_stage=1 (DDP + ZeroRedundancyOptimizer) is pure data parallel here; "
                             "with tp or pp use zero_stage 2 or 3 (FSDP2)")
        if self.offload == "optimizer+params" and stage != 3:
            raise InputError("parallel.offload=optimizer+params needs parameter sharding: set parallel.zero_stage 3 "
                             "(FSDP2 CPUOffloadPolicy), or use parallel.offload optimizer")
        if self.offload != "none" and stage not in (2, 3):
            raise InputError(f"parallel.offload={self.offload!r} runs through FSDP2's CPUOffloadPolicy: "
                             "set parallel.zero_stage to 2 or 3 (or parallel.dp_shard > 1)")
        if self.uses_ddp() and (self.tp > 1 or self.pp > 1):
            raise InputError("DDP (dp_replicate > 1 with dp_shard 1) cannot wrap tensor- or pipeline-parallel "
                             "modules; use parallel.dp_shard (FSDP2, or HSDP with dp_replicate) instead")
        if self.pp_schedule not in ("gpipe", "1f1b", "interleaved_1f1b"):
            raise InputError(f"parallel.pp_schedule={self.pp_schedule!r}: choose gpipe, 1f1b or interleaved_1f1b")
