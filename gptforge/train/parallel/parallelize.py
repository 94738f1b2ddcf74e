"""Everything applied to the model from outside: the parallel layout, activation checkpointing,
torch.compile. The model module itself stays unaware of all of these.

Order, as in torchtitan's `parallelize_llama`/`pipeline_llama`:
1. pipeline split (`torch.distributed.pipelining`): this rank keeps its stage(s) of blocks;
2. tensor parallel (`parallelize_module`): q/k/v/up/gate colwise, o/down rowwise, with sequence
   parallel norms (the residual stream between blocks is split along the sequence);
3. activation checkpointing, per block;
4. torch.compile: per block, or the whole model for a single process (`apply_compile`);
5. data parallel: FSDP2 `fully_shard` per block then the root (ZeRO-2/3, HSDP with
   dp_replicate), or DDP (replicated, ZeRO-1's gradient all-reduce).

ZeRO stage -> PyTorch mechanism (see docs/distributed.md):
- 1 (optimizer states sharded): DDP all-reduces full gradients, `ZeroRedundancyOptimizer` keeps
  each rank's share of the AdamW states, updates that share and broadcasts the new parameters.
- 2 (+ gradients sharded): FSDP2 with `reshard_after_forward=False`: parameters are gathered
  once per step and kept through backward; gradients are reduce-scattered; states are sharded.
- 3 (+ parameters sharded): FSDP2 with `reshard_after_forward=True` (full sharding).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, cast

import torch
import torch.nn as nn

from gptforge.config import ModelConfig, ParallelConfig, TrainConfig
from gptforge.model.gpt import GPT
from gptforge.runtime.activation import apply_activation_checkpointing

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel


def apply_compile(model: nn.Module, whole: bool = False) -> nn.Module:
    """torch.compile `model` in place; parameter and state_dict names stay as they are.

    whole=True: the whole model as one graph (`nn.Module.compile`), which lets Inductor fuse across
    block boundaries and the head, and keeps no activations at graph boundaries (step times in
    bench/RESULTS.md, issue 29); for a single process, where no parallel wrapper needs per-block
    modules. whole=False: each block separately, as tensor/pipeline parallelism,
    FSDP2 per-block sharding and DeepSpeed need (fast to compile; the repeated block graph is reused).
    Calls under `torch.compiler.set_stance("force_eager")` run the eager modules either way.
    """
    if whole:
        model.compile()
        return model
    blocks = cast(nn.Module, model.blocks)
    for name, block in list(blocks.named_children()):
        setattr(blocks, name, torch.compile(block))
    return model


# ---------------------------------------------------------------------------------------------
# Pipeline parallel


class PipelineStageModule(nn.Module):
    """One pipeline stage of a GPT, holding the GPT's own submodules under the GPT's names
    (`wte`, `wpe`, `blocks.<layer index>`, `norm_f`, `lm_head`), so parameter names, optimizer
    states and checkpoints match the unsplit model.

    forward: first stage idx (B, T) int64 -> hidden (B, T, C); middle stages hidden -> hidden;
    last stage hidden -> logits (B, T, V). With sequence-parallel TP the hidden states between
    stages are this rank's sequence slice (B, T / tp, C).
    """

    def __init__(self, gpt: GPT, layers: list[int], first: bool, last: bool):
        super().__init__()
        self.config = gpt.config
        self.first, self.last = first, last
        self.seq_shards = 1  # set to tp by sequence-parallel TP (hidden states hold T / tp)
        if first:
            self.wte = gpt.wte
            if self.config.arch == "gpt2":
                self.wpe = gpt.wpe
            self.drop = gpt.drop
        self.blocks = nn.ModuleDict({str(i): gpt.blocks[i] for i in layers})
        if last:
            self.norm_f = gpt.norm_f
            self.lm_head = gpt.lm_head
        if self.config.arch == "llama":
            self.register_buffer("rope_cos", gpt.rope_cos, persistent=False)
            self.register_buffer("rope_sin", gpt.rope_sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # GPT.forward's own pieces (embed, rope_at, head), on the submodules this stage holds under
        # the GPT's names (hence the ignores: the methods are GPT's, `self` is this stage).
        T = x.size(1) if self.first else x.size(1) * self.seq_shards
        pos = torch.arange(T, device=x.device)[None]
        h = GPT.embed(self, x, pos) if self.first else x  # type: ignore[arg-type]
        rope = GPT.rope_at(self, pos)  # type: ignore[arg-type]
        for block in self.blocks.values():
            h = block(h, rope, None, None)
        return GPT.head(self, h) if self.last else h  # type: ignore[arg-type]


def split_layers(n_layer: int, n_stages: int) -> list[list[int]]:
    """Contiguous, as even as possible split of layer indices over stages (earlier stages get
    the extra layers; the first holds the embeddings, the last the norm and output head).

    Raises:
        ValueError: fewer layers than stages.
    """
    if n_layer < n_stages:
        raise ValueError(f"model.n_layer={n_layer} is smaller than the number of pipeline stages ({n_stages}); "
                         "lower parallel.pp or use a non-interleaved schedule")
    base, extra = divmod(n_layer, n_stages)
    out, start = [], 0
    for s in range(n_stages):
        n = base + (1 if s < extra else 0)
        out.append(list(range(start, start + n)))
        start += n
    return out


class _ModelPartsView(nn.Module):
    """A parameter-holding view over several stage modules of one rank (interleaved schedule),
    named like the full GPT, for the optimizer, gradient clipping and checkpoints."""

    def __init__(self, parts: Sequence[nn.Module]):
        super().__init__()
        self.blocks = nn.ModuleDict()
        for p in parts:
            for name, child in p.named_children():
                if name == "blocks":
                    for k, b in child.named_children():
                        self.blocks[k] = b
                else:
                    setattr(self, name, child)


# ---------------------------------------------------------------------------------------------
# Tensor parallel


def check_tp(cfg: ModelConfig, tp: int) -> None:
    """Raises ValueError when heads (or the KV heads) cannot be split evenly over tp ranks."""
    if cfg.n_head % tp or cfg.n_kv_head % tp:
        raise ValueError(f"parallel.tp={tp} must divide model.n_head ({cfg.n_head}) and model.n_kv_head "
                         f"({cfg.n_kv_head}): each rank computes whole attention heads")


def apply_tensor_parallel(model: GPT | PipelineStageModule, tp_mesh, first_block: str | None) -> None:
    """Megatron-style TP with sequence parallelism (Korthikanti et al. 2022, section 4.2.2).

    Per block: norms run on sequence shards (SequenceParallel); the attention/MLP input is
    all-gathered to the full sequence; q/k/v and up/gate are split by output columns (heads), o
    and down by input rows, their outputs reduce-scattered back to sequence shards. The token
    embedding is split by vocabulary rows (output all-reduced); the output head by vocabulary
    columns (input gathered from the final norm's sequence shards, logits gathered whole).
    `first_block` (the block after the embeddings on this stage, if any) turns the replicated
    embedding output into sequence shards. Tied embeddings stay tied (both are split on dim 0).
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    tied = getattr(model, "wte", None) is not None and getattr(model, "lm_head", None) is not None \
        and model.lm_head.weight is model.wte.weight
    top: dict[str, Any] = {}
    if hasattr(model, "wte"):
        top["wte"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if hasattr(model, "lm_head"):
        top["norm_f"] = SequenceParallel()
        top["lm_head"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate(), use_local_output=True)
    if top:
        parallelize_module(model, tp_mesh, top)
    for name, block in cast(nn.Module, model.blocks).named_children():
        plan: dict[str, Any] = {
            "norm_1": SequenceParallel(),
            "attn": PrepareModuleInput(input_layouts=(Shard(1), None, None, None),
                                       desired_input_layouts=(Replicate(), None, None, None)),
            "attn.q_proj": ColwiseParallel(),
            "attn.k_proj": ColwiseParallel(),
            "attn.v_proj": ColwiseParallel(),
            "attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            "norm_2": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
        }
        if hasattr(block.mlp, "gate_proj"):
            plan["mlp.gate_proj"] = ColwiseParallel()
        parallelize_module(block, tp_mesh, plan)
        if name == first_block:
            parallelize_module(block, tp_mesh, PrepareModuleInput(
                input_layouts=(Replicate(), None, None, None),
                desired_input_layouts=(Shard(1), None, None, None), use_local_output=True))
    if tied:
        # parallelize_module re-wrapped lm_head.weight in a new Parameter: share it again.
        model.lm_head.weight = model.wte.weight
    if isinstance(model, PipelineStageModule):
        model.seq_shards = tp_mesh.size()


# ---------------------------------------------------------------------------------------------
# Data parallel


def apply_fsdp(model: GPT | PipelineStageModule, dp_mesh, reshard_after_forward: bool, precision: str, offload: bool,
               device: torch.device) -> None:
    """FSDP2 `fully_shard` on each block, then on the root (embeddings, final norm, head).

    precision bf16/fp16: MixedPrecisionPolicy with parameters gathered in that dtype and gradients
    reduced in fp32. offload: CPUOffloadPolicy (sharded parameters, gradients and the optimizer
    step in CPU memory; pinned only when CUDA exists).
    """
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        fully_shard,
    )

    kw: dict[str, Any] = {"mesh": dp_mesh, "reshard_after_forward": reshard_after_forward}
    if precision in ("bf16", "fp16"):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    if offload:
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
    for _, block in cast(nn.Module, model.blocks).named_children():
        fully_shard(block, **kw)
    fully_shard(model, **kw)


@dataclass
class Parallelized:
    """The model as laid out on this rank.

    module: what the loop calls for forward (the GPT, DDP wrapper or FSDP2 module); None under
        pipeline parallelism, where `schedule.step` runs the stages.
    core: the parameters under the GPT's own names, for the optimizer, clipping and checkpoints.
    stages, schedule: pipeline stages of this rank and their schedule (pp > 1).
    zero_stage: as run (see distributed.effective_zero_stage).
    """

    module: nn.Module | None
    core: nn.Module
    zero_stage: int = 0
    ddp: DistributedDataParallel | None = None
    fsdp: bool = False
    stages: list = field(default_factory=list)
    stage_modules: list = field(default_factory=list)
    schedule: Any = None
    n_microbatches: int = 1

    def grad_sync(self, is_last: bool):
        """Context for one micro-batch's backward: gradients are reduced across data-parallel
        ranks only on the last micro-batch of a step (DDP no_sync; FSDP2
        set_requires_gradient_sync), the others accumulate locally."""
        if self.fsdp:
            cast("FSDPModule", self.core).set_requires_gradient_sync(is_last)
            return contextlib.nullcontext()
        if self.ddp is not None and not is_last:
            return self.ddp.no_sync()
        return contextlib.nullcontext()


def parallelize(model: GPT, tc: TrainConfig, pc: ParallelConfig, env,
                pp_loss_fn: Callable | None = None) -> Parallelized:
    """Lay `model` (a full GPT, built identically on every rank) out on this rank's devices.

    Single process without a layout: activation checkpointing and compile (of the whole model) only.

    Raises:
        ValueError: a layout the model cannot take (heads not divisible by tp, fewer layers
            than stages, tied embeddings split across pipeline stages).
    """

    zero = pc.effective_zero_stage()
    if not env.distributed:
        model.to(env.device)
        apply_activation_checkpointing(model, tc.activation_checkpointing)
        if tc.compile:
            apply_compile(model, whole=True)
        return Parallelized(module=model, core=model)

    cfg = model.config
    if pc.tp > 1:
        check_tp(cfg, pc.tp)
    parts: list[GPT | PipelineStageModule]
    if pc.pp > 1:
        if cfg.tie_embeddings:
            raise ValueError("parallel.pp > 1 splits the token embedding and the output head onto different "
                             "stages: set model.tie_embeddings=false")
        virtual = 2 if pc.pp_schedule == "interleaved_1f1b" else 1
        n_stages = pc.pp * virtual
        layers = split_layers(cfg.n_layer, n_stages)
        my_stages = [s for s in range(n_stages) if s % pc.pp == env.pp_rank]
        parts = [PipelineStageModule(model, layers[s], s == 0, s == n_stages - 1) for s in my_stages]
    else:
        my_stages, n_stages = [0], 1
        parts = [model]
    for part in parts:
        part.to(env.device)
        if pc.tp > 1:
            first = None
            if hasattr(part, "wte"):
                first = next(iter(dict(cast(nn.Module, part.blocks).named_children())), None)
            apply_tensor_parallel(part, env.mesh["tp"], first)
        apply_activation_checkpointing(part, tc.activation_checkpointing)
        if tc.compile:
            apply_compile(part)
        if zero in (2, 3):
            dp_mesh = env.mesh["dp_replicate", "dp_shard"] if pc.dp_replicate > 1 else env.mesh["dp_shard"]
            # Under PP each micro-batch would re-gather resharded parameters: keep them (torchtitan).
            raf = zero == 3 and pc.pp == 1
            apply_fsdp(part, dp_mesh, raf, tc.precision, pc.offload != "none", env.device)
    core = parts[0] if len(parts) == 1 else _ModelPartsView(parts)
    out = Parallelized(module=None, core=core, zero_stage=zero, fsdp=zero in (2, 3))
    if pc.pp > 1:
        return _pipeline(out, parts, my_stages, n_stages, tc, pc, env, pp_loss_fn)
    if pc.uses_ddp():
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, process_group=env.group("dp"),
                  device_ids=[env.device.index] if env.device.type == "cuda" else None)
        out.module, out.ddp = ddp, ddp
        return out
    out.module = model
    return out


def place_frozen(model: GPT, tc: TrainConfig, pc: ParallelConfig, env) -> GPT:
    """Lay a frozen model (a distillation teacher, a preference reference) out like the policy:
    on this rank's device, eval mode, no gradients; under tensor parallel the policy's TP plan;
    under FSDP2 (ZeRO-2/3) sharded over the same data-parallel mesh (its forward is then collective:
    every rank calls it in step, as the policy's). No DDP wrapper (nothing to reduce), no
    activation checkpointing or compile. Returns `model`.

    Raises:
        InputError: under pipeline parallelism (a frozen model is not split into stages).
    """
    from gptforge.errors import InputError

    if pc.pp > 1:
        raise InputError("a frozen reference or teacher model is not laid out under pipeline parallelism "
                         "(parallel.pp > 1): use data, tensor or FSDP2 parallelism")
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    model.to(env.device)
    if not env.distributed:
        return model
    if pc.tp > 1:
        check_tp(model.config, pc.tp)
        apply_tensor_parallel(model, env.mesh["tp"], next(iter(dict(cast(nn.Module, model.blocks).named_children())),
                                                          None))
    if pc.effective_zero_stage() in (2, 3):
        dp_mesh = env.mesh["dp_replicate", "dp_shard"] if pc.dp_replicate > 1 else env.mesh["dp_shard"]
        apply_fsdp(model, dp_mesh, True, tc.precision, False, env.device)
    return model


def _pipeline(out: Parallelized, parts: Sequence[nn.Module], my_stages: list[int], n_stages: int, tc: TrainConfig,
              pc: ParallelConfig, env, pp_loss_fn: Callable | None) -> Parallelized:
    """Attach this rank's PipelineStages and the schedule (pc.pp_schedule) to `out`."""
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    if pp_loss_fn is None:
        raise ValueError("pipeline parallelism needs a loss function for the last stage")
    group = env.group("pp")
    out.stages = [PipelineStage(p, s, n_stages, env.device, group=group) for p, s in zip(parts, my_stages, strict=True)]
    out.stage_modules = list(parts)
    local_batch = tc.micro_batch_size * tc.gradient_accumulation_steps
    n_mb = pc.pp_microbatches or max(tc.gradient_accumulation_steps, pc.pp)
    if local_batch % n_mb:
        raise ValueError(f"parallel.pp_microbatches={n_mb} must divide the per-rank batch of "
                         f"train.micro_batch_size * train.gradient_accumulation_steps = {local_batch} sequences")
    out.n_microbatches = n_mb
    # Losses are already divided by the step's global token count, so the schedule must not
    # divide the gradients by the micro-batch count again (scale_grads=False).
    if pc.pp_schedule == "interleaved_1f1b":
        out.schedule = ScheduleInterleaved1F1B(out.stages, n_mb, loss_fn=pp_loss_fn, scale_grads=False)
    else:
        cls = ScheduleGPipe if pc.pp_schedule == "gpipe" else Schedule1F1B
        out.schedule = cls(out.stages[0], n_mb, loss_fn=pp_loss_fn, scale_grads=False)
    return out
