"""Closed-form per-GPU training memory: model states, activations, logits/loss buffers, overheads.

Sources for the formulas:
- Model states: Rajbhandari et al. 2019, "ZeRO: Memory Optimizations Toward Training Trillion
  Parameter Models", section 5 and figure 1. With Psi parameters, K bytes of optimizer state per
  parameter (K = 12 for mixed-precision Adam: fp32 master weights, momentum, variance) and Nd
  data-parallel ranks, the per-GPU model states are (2 + 2 + K) * Psi at stage 0, 4*Psi + K*Psi/Nd
  at stage 1 (P_os), 2*Psi + (2 + K)*Psi/Nd at stage 2 (P_os+g) and (2 + 2 + K)*Psi/Nd at stage 3
  (P_os+g+p). `zero_paper_model_state_bytes` is that formula verbatim.
  gptforge trains the way PyTorch autocast and FSDP2 do: fp32 parameters (which double as the
  master copy), fp32 gradients and fp32 Adam moments, 4 + 4 + 8 = 16 bytes per parameter as in
  the paper, sharded by the same rule; the 16-bit copy of each weight is made per forward by
  autocast (counted as `autocast_weight_copies`) or gathered per layer by FSDP2 (counted in
  `comm_buckets`).
- Activations: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models", table 2 (per-layer bytes sbh(34 + 5as/h) with 16-bit activations and dropout, and its
  tensor/sequence-parallel and selective/full-recompute variants). `korthikanti_bytes_per_layer` is
  the table verbatim. `layer_activation_bytes` counts the same things for gptforge's own block, tensor
  by tensor as autograd saves them: attention through SDPA (flash/memory-efficient kernels keep
  the output and a logsumexp, not the (s, s) score matrix), no dropout masks at dropout 0,
  grouped-query K/V, SwiGLU's four d_ff-wide tensors, RMSNorm's fp32 normalised input, the fp32
  residual stream under autocast and the input cast autocast makes for each linear layer.
- Logits and loss: the lm_head output (B, T, V) in the compute dtype, its fp32 upcast's
  log-softmax (saved by cross-entropy), and in backward the fp32 gradient of the log-softmax and of
  the logits, alive together: (e + 4 + 8) * B*T*V bytes. For GPT-2 small at B=8, T=1024 that is
  5.3 GB, more than the model states.

Everything the fake-tensor tracker can see (`peak_tensor_bytes`) is counted tensor by tensor. CUDA
context, allocator margin and communication buckets cannot be observed on a CPU; they are stated
assumptions, listed in `MemoryEstimate.assumptions` with their sources.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field

from gptforge.config import ModelConfig, ParallelConfig, TrainConfig
from gptforge.plan.activations import act_bytes, layer_activation_bytes, recompute_split
from gptforge.plan.params import (
    block_param_count,
    block_param_shapes,
    param_count,
    param_shapes,
)

GiB = 2**30
MiB = 2**20

# Stated assumptions (bytes). CUDA context: the driver context plus cuBLAS/cuDNN handles with lazy
# module loading (CUDA >= 11.7): a few hundred MiB per process, varying with GPU, driver and CUDA
# version, so 600 MiB is a stated assumption (not a tensor, invisible to the fake tracker); NCCL adds its own buffers per communicator (NCCL docs, NCCL_BUFFSIZE default 4 MiB per
# channel and peer). Allocator margin: the caching allocator reserves more than is allocated (block
# rounding, fragmentation); 7% is an assumption to replace with bench/gpu_check.py figures.
CUDA_CONTEXT_BYTES = 600 * MiB
NCCL_BYTES = 512 * MiB
ALLOCATOR_MARGIN_FRACTION = 0.07
DDP_BUCKET_BYTES = 25 * MiB  # torch DDP bucket_cap_mb default
PIPELINE_VIRTUAL_STAGES = 2  # interleaved 1F1B: model chunks per rank assumed when not configured


def optimizer_state_bytes(cfg: ModelConfig, optimizer: str, shapes=None) -> int:
    """Optimizer state bytes for the whole model, unsharded.

    adamw: two fp32 moments, 8 bytes/param (Loshchilov & Hutter 2019; torch.optim.AdamW).
    adamw8bit: two 8-bit moments with one fp32 absmax per 2048-value block, ~2 bytes/param
    (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization").
    sgd: one fp32 momentum buffer, 4 bytes/param (momentum 0.9 assumed).
    muon: one fp32 momentum buffer (4 bytes/param) for each Muon matrix (the 2-D weights inside
    the blocks, torch.optim.Muon) and AdamW's 8 bytes/param for the rest (embeddings, head,
    norms, biases), as `gptforge.train.optim.muon_split` splits them.
    adafactor: factored second moment, fp32 row and column statistics (r + c per matrix, n per
    vector), no first moment (Shazeer & Stern 2018; torch.optim.Adafactor with beta1 None).

    Raises:
        ValueError: unknown optimizer.
    """
    shapes = shapes if shapes is not None else param_shapes(cfg)
    n = sum(p.numel for p in shapes)
    if optimizer == "adamw":
        return 8 * n
    if optimizer == "adamw8bit":
        return 2 * n + 2 * 4 * math.ceil(n / 2048)
    if optimizer == "sgd":
        return 4 * n
    if optimizer == "muon":
        m = sum(p.numel for p in shapes if is_muon_param(p))
        return 4 * m + 8 * (n - m)
    if optimizer == "adafactor":
        total = 0
        for p in shapes:
            if p.is_matrix:
                total += 4 * (p.shape[-2] + p.shape[-1])
            else:
                total += 4 * p.numel
        return total
    raise ValueError(f"train.optimizer: unknown optimizer {optimizer!r}; choose adamw, adamw8bit, sgd, muon or "
                     "adafactor")


def is_muon_param(p) -> bool:
    """Whether a `ParamShape` is a Muon matrix: a 2-D weight inside a block, not a value embedding."""
    return p.role == "block" and len(p.shape) == 2 and not p.name.endswith("v_embed.weight")


def zero_paper_model_state_bytes(n_params: float, dp: int, stage: int, k: float = 12.0) -> float:
    """Per-GPU model-state bytes of ZeRO (Rajbhandari et al. 2019, section 5.1-5.3, figure 1).

    Mixed-precision Adam: 2*Psi (fp16 weights) + 2*Psi (fp16 grads) + K*Psi (fp32 master weights,
    momentum, variance; K = 12), partitioned over Nd = dp ranks:
      stage 0: (2 + 2 + K) * Psi          stage 1: (2 + 2) * Psi + K * Psi / Nd
      stage 2: 2 * Psi + (2 + K) * Psi / Nd   stage 3: (2 + 2 + K) * Psi / Nd
    Example (figure 1): Psi = 7.5e9, Nd = 64 -> 120, 31.4, 16.6, 1.88 GB.

    Raises:
        ValueError: stage outside 0-3 or dp < 1.
    """
    if dp < 1:
        raise ValueError("dp must be >= 1")
    if stage == 0:
        return (4 + k) * n_params
    if stage == 1:
        return 4 * n_params + k * n_params / dp
    if stage == 2:
        return 2 * n_params + (2 + k) * n_params / dp
    if stage == 3:
        return (4 + k) * n_params / dp
    raise ValueError(f"parallel.zero_stage must be 0, 1, 2 or 3, got {stage}")


@dataclass
class MemoryEstimate:
    """Per-GPU memory of one training job, in bytes, with the phase where the peak happens."""

    param_count: int
    weights: int
    """Parameters resident on this GPU (fp32; sharded by ZeRO-3, split by tp/pp)."""
    gradients: int
    """Gradient bytes resident at the peak (fp32; sharded by ZeRO-2/3)."""
    optimizer_states: int
    """Optimizer states on this GPU (sharded by ZeRO-1/2/3; 0 when offloaded)."""
    activations_per_layer: int
    """One block's saved activations for one micro-batch, no recomputation."""
    activations_per_layer_stored: int
    """What one block keeps under the chosen activation checkpointing."""
    activations: int
    """All blocks' stored activations on this GPU, including pipeline micro-batches in flight."""
    other_activations: int
    """Embedding output, final norm, RoPE tables, lm_head input."""
    autocast_weight_copies: int
    """16-bit copies of the weight matrices autocast makes in forward and autograd keeps."""
    logits_and_loss: int
    """Logits (B, T, V), fp32 log-softmax and, at the start of backward, fp32 gradients of both."""
    backward_temp: int
    """Transient gradients of one block's activations (and its recomputed forward)."""
    optimizer_temp: int
    """Transient memory of the optimizer step (0 for fused AdamW)."""
    comm_buckets: int
    """Communication buffers: DDP buckets, FSDP2 all-gathered layers and reduce-scatter inputs."""
    cuda_context: int
    allocator_margin: int
    peak_tensor_bytes: int
    """Peak of live tensor bytes (what a memory tracker sees)."""
    total: int
    """peak_tensor_bytes + comm_buckets + cuda_context + allocator_margin."""
    peak_phase: str
    """'loss backward', 'block backward', 'end of backward' or 'optimizer step'."""
    phases: dict = field(default_factory=dict)
    """Tensor bytes at each candidate peak phase."""
    peak_parts: dict = field(default_factory=dict)
    """What is live at the peak phase, by part; sums to peak_tensor_bytes."""
    capacity: int = 0
    """Device memory of the GPU (0 when no GPU given)."""
    fits: bool | None = None
    cpu_offload_bytes: int = 0
    """Model-state bytes held in CPU memory by offload."""
    assumptions: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def planning_train(train: TrainConfig, gpu=None) -> TrainConfig:
    """The train config the planner models: `precision auto` is what the trainer picks on that
    GPU (bf16 where it has bf16, else fp32; bf16 when no GPU is named)."""
    if train.precision != "auto":
        return train
    bf16 = gpu is None or getattr(gpu, "bf16_tflops", None) is not None
    return dataclasses.replace(train, precision="bf16" if bf16 else "fp32")


def planning_layout(parallel: ParallelConfig) -> ParallelConfig:
    """The layout the planner models: a degree of -1 (the rest of the processes) is 1 when no GPU
    count says otherwise (`gptforge.plan.planner.resolve_layout` fills it from --num-gpus)."""
    fixed = 1
    for n in ParallelConfig.DEGREES:
        fixed *= max(getattr(parallel, n), 1)
    return parallel.resolved(fixed)


def validate(model: ModelConfig, train: TrainConfig, parallel: ParallelConfig) -> None:
    """Check a layout is one the planner (and trainer) can describe.

    Raises:
        ValueError: naming the field and what to do.
    """
    planning_layout(parallel).validate()
    if train.micro_batch_size < 1:
        raise ValueError(f"train.micro_batch_size must be >= 1, got {train.micro_batch_size}")
    if train.gradient_accumulation_steps < 1:
        raise ValueError(f"train.gradient_accumulation_steps must be >= 1, got {train.gradient_accumulation_steps}")
    if model.n_head % parallel.tp:
        raise ValueError(f"parallel.tp={parallel.tp} must divide model.n_head={model.n_head}")
    if model.d_ff % parallel.tp:
        raise ValueError(f"parallel.tp={parallel.tp} must divide model.d_ff={model.d_ff}")
    if parallel.pp > model.n_layer:
        raise ValueError(f"parallel.pp={parallel.pp} exceeds model.n_layer={model.n_layer}")



@dataclass(frozen=True)
class _Job:
    """The shape of one training step as the memory terms see it (resolved model, planning layout)."""

    cfg: ModelConfig
    train: TrainConfig
    parallel: ParallelConfig

    @property
    def precision(self) -> str:
        return self.train.precision

    @property
    def autocast(self) -> bool:
        return self.train.precision != "fp32"

    @property
    def e(self) -> int:
        """Bytes per activation element under the job's precision."""
        return act_bytes(self.train.precision)

    @property
    def t(self) -> int:
        return self.parallel.tp

    @property
    def p(self) -> int:
        return self.parallel.pp

    @property
    def stage(self) -> int:
        return self.parallel.effective_zero_stage()

    @property
    def bsh(self) -> int:
        """Elements of one (b, s, h) activation on this tensor-parallel rank."""
        return self.train.micro_batch_size * self.cfg.block_size * self.cfg.d_model // self.t

    @property
    def wte(self) -> int:
        return self.cfg.vocab_size * self.cfg.d_model

    @property
    def layers_per_stage(self) -> int:
        return math.ceil(self.cfg.n_layer / self.p)


@dataclass
class _ModelStates:
    weights: int
    gradients: int
    optimizer_states: int
    cpu_offload: int


def model_state_bytes(job: _Job) -> _ModelStates:
    """fp32 weights, fp32 gradients and optimizer states on the busiest rank, in bytes, after ZeRO
    sharding (Rajbhandari et al. 2020, sec. 5: stage 1 shards optimizer states, 2 adds gradients,
    3 adds weights) and CPU offload.

    Blocks are split over pp stages and tp; embeddings and head are vocab-parallel under tp; with
    pp the first stage holds the embedding, the last the head (a tied embedding is held by both).
    """
    cfg, t, p = job.cfg, job.t, job.p
    shapes = param_shapes(cfg)
    n_total = param_count(cfg)
    n_block = block_param_count(cfg)
    n_embed = sum(x.numel for x in shapes if x.role == "embedding")
    n_head_only = sum(x.numel for x in shapes if x.role == "head")
    n_final = sum(x.numel for x in shapes if x.role == "final_norm")
    lps = job.layers_per_stage
    if p == 1:
        local = lps * n_block / t + n_embed / t + n_head_only / t + n_final
    else:
        first = lps * n_block / t + n_embed / t
        last = lps * n_block / t + (n_head_only or job.wte) / t + n_final
        local = max(first, last)
    local = int(local)
    opt = optimizer_state_bytes(cfg, job.train.optimizer, shapes) * local // max(n_total, 1)
    weights, grads = 4 * local, 4 * local
    stage = job.stage
    nd = job.parallel.shard_degree() if stage > 0 else 1
    if stage >= 1:
        opt = opt // nd
    if stage >= 2:
        grads = grads // nd
    if stage >= 3:
        weights = weights // nd
    cpu = 0
    offload = job.parallel.offload
    if offload in ("optimizer", "optimizer+params"):
        cpu += opt
        opt = 0
    if offload == "optimizer+params":
        cpu += weights + grads
        weights, grads = 0, 0
    return _ModelStates(weights, grads, opt, cpu)


@dataclass
class _BlockActivations:
    per_layer: int
    """One block's saved activations, no recomputation."""
    layer_input: int
    """The fp32 residual a checkpointed block keeps."""
    n_checkpointed: int
    n_stored: int
    stack: int
    """All blocks of one stage for one micro-batch."""
    in_flight: int
    """`stack` times the pipeline micro-batches in flight."""


def block_activation_bytes(job: _Job, assumptions: list[str]) -> _BlockActivations:
    """Stored activations of the blocks on the first stage, in bytes, under the chosen activation
    checkpointing, times the pipeline micro-batches in flight (Korthikanti et al. 2022, sec. 4.2.3;
    Narayanan et al. 2021 for 1F1B and interleaving)."""
    cfg, train, parallel, t, p = job.cfg, job.train, job.parallel, job.t, job.p
    b, s, h = train.micro_batch_size, cfg.block_size, cfg.d_model
    per_layer = layer_activation_bytes(cfg, job.precision, b, s, tp=t, sequence_parallel=t > 1).total
    layer_input = 4 * b * s * h // t
    n_ckpt, n_stored = recompute_split(job.layers_per_stage, train.activation_checkpointing)
    stack = n_ckpt * layer_input + n_stored * per_layer
    m = parallel.pp_microbatches or max(train.gradient_accumulation_steps, p)
    in_flight = 1.0
    if p > 1:
        if parallel.pp_schedule == "gpipe":
            in_flight = float(m)
        elif parallel.pp_schedule == "1f1b":
            in_flight = float(min(p, m))
        else:
            in_flight = min(p, m) * (1 + (p - 1) / (p * PIPELINE_VIRTUAL_STAGES))
            assumptions.append(f"interleaved 1F1B with {PIPELINE_VIRTUAL_STAGES} model chunks per rank")
    return _BlockActivations(per_layer, layer_input, n_ckpt, n_stored, stack, int(stack * in_flight))


def other_activation_bytes(job: _Job) -> int:
    """Activations outside the blocks, in bytes: final norm and the lm_head input (its 16-bit cast
    under autocast), RoPE's cos/sin tables for Llama blocks. The embedding output is saved by block
    0's norm and counted there."""
    cfg, b, s, bsh, e = job.cfg, job.train.micro_batch_size, job.cfg.block_size, job.bsh, job.e
    cast = e if job.autocast else 4
    if cfg.arch == "llama":
        return int(4 * bsh + 4 * b * s + 4 * bsh + cast * bsh + 2 * s * cfg.head_dim * 4)
    return int(4 * bsh + 8 * b * s + cast * bsh)


def autocast_copy_bytes(job: _Job, n_stored: int) -> tuple[int, int]:
    """(all copies, one block's copies) in bytes: autocast keeps a 16-bit copy of every weight
    matrix it casts (blocks and lm_head; the embedding lookup is not cast); a checkpointed block's
    forward saves nothing, so its copies are dropped. FSDP2 with a bf16 MixedPrecisionPolicy gathers
    16-bit weights instead, counted in the communication buffers."""
    if not job.autocast or job.stage >= 3:
        return 0, 0
    block_matrix = sum(x.numel for x in block_param_shapes(job.cfg) if x.is_matrix)
    copy_block = 2 * block_matrix // job.t
    return int(n_stored * copy_block + 2 * job.wte / job.t), copy_block


def logits_loss_bytes(job: _Job, logits_kept: bool) -> tuple[int, int]:
    """(logits kept by the loop, logits and loss at the start of backward) in bytes on the last
    stage: cross-entropy on logits.float() saves the fp32 log-softmax; in backward the gradients of
    the log-softmax and of the logits exist together; a logit soft cap saves tanh's fp32 output."""
    bsv = job.train.micro_batch_size * job.cfg.block_size * job.cfg.vocab_size // job.t
    kept = (job.e if job.autocast else 4) * bsv if logits_kept else 0
    total = kept + 4 * bsv + 8 * bsv
    if job.cfg.logit_softcap:
        total += 4 * bsv
    return kept, total


def backward_temp_bytes(job: _Job, acts: _BlockActivations, copy_block: int) -> int:
    """Transients of one block's backward, in bytes: gradients of its activations and, with
    recomputation, that block's recomputed forward (and its autocast copies)."""
    cfg = job.cfg
    f_local = job.train.micro_batch_size * cfg.block_size * cfg.d_ff // job.t
    gated = cfg.arch == "llama" and cfg.activation != "relu2"
    temp = 2 * 4 * job.bsh + (3 if gated else 2) * job.e * f_local
    if acts.n_checkpointed:
        temp += acts.per_layer + copy_block
    return temp


def optimizer_temp_bytes(job: _Job, fused_optimizer: bool) -> int:
    """Transient bytes of the optimizer step: one parameter's fp32 worth for the single-tensor
    AdamW/SGD loop (0 fused); for torch.optim.Muon, working one matrix at a time, the fp32 Nesterov
    update, its bf16 Newton-Schulz iterate and next iterate, and two bf16 (min dim)^2 Gram products."""
    shapes = param_shapes(job.cfg)
    temp = 0
    if not fused_optimizer and job.train.optimizer in ("adamw", "sgd"):
        temp = 4 * max(x.numel for x in shapes) // job.t
    if job.train.optimizer == "muon":
        mats = [x for x in shapes if is_muon_param(x)]
        if mats:
            big = max(mats, key=lambda x: x.numel)
            temp = (4 * big.numel + 2 * 2 * big.numel + 2 * 2 * min(big.shape) ** 2) // job.t
    return temp


def comm_buffer_bytes(job: _Job, assumptions: list[str]) -> int:
    """Communication buffers in bytes: FSDP2's gathered blocks and reduce-scatter inputs, DDP's
    gradient buckets, tensor/pipeline parallel (b, s, h) buffers."""
    comm = 0
    t = job.t
    if job.stage == 3:
        n_block = block_param_count(job.cfg)
        comm += int(2 * n_block / t * job.e) + int(2 * n_block / t * 4)
        comm += int(job.wte / t * job.e)
        assumptions.append("FSDP2 (ZeRO-3): two blocks gathered at a time (current + prefetch) in the compute "
                           "dtype, two blocks' fp32 gradients awaiting reduce-scatter, the embedding gathered")
    elif job.parallel.dp > 1:
        comm += 2 * DDP_BUCKET_BYTES
        assumptions.append("data parallel gradient buckets: 2 x 25 MiB in flight (DDP bucket_cap_mb default, "
                           "gradient_as_bucket_view=True)")
    if t > 1 or job.p > 1:
        comm += 2 * 4 * job.bsh
        assumptions.append("tensor/pipeline parallel: two (b, s, h) fp32 communication buffers")
    return comm


def _phase_parts(job: _Job, ms: _ModelStates, acts: _BlockActivations, other: int, copies: int,
                 logits: tuple[int, int], bw_temp: int, opt_temp: int, frozen_head: bool) -> dict[str, dict[str, int]]:
    """Live tensor bytes by part at each candidate peak phase (see `estimate_memory`)."""
    kept, logits_loss = logits
    grads = ms.gradients
    # Gradients resident during backward: with accumulation, earlier micro-batches' gradients.
    grads_during = grads if (job.train.gradient_accumulation_steps > 1 or job.p > 1) else 0
    head_grad = 0 if frozen_head else 4 * job.wte // job.t  # lm_head's weight gradient after the loss backward
    # Tied embeddings: the embedding's dense gradient arrives after lm_head's and is summed into a
    # new tensor, so two more (V, h) fp32 buffers exist at the very end of backward.
    tied_grad_temp = 2 * head_grad if job.cfg.tie_embeddings else 0
    base = {"weights": ms.weights, "optimizer_states": ms.optimizer_states}
    parts = {
        "loss backward": {**base, "gradients": grads_during, "activations": acts.in_flight,
                          "other_activations": other, "autocast_weight_copies": copies,
                          "logits_and_loss": logits_loss},
        "block backward": {**base, "gradients": grads_during or head_grad, "activations": acts.in_flight,
                           "other_activations": other, "autocast_weight_copies": copies,
                           "logits_and_loss": kept, "backward_temp": bw_temp},
        "end of backward": {**base, "gradients": grads, "other_activations": other,
                            "logits_and_loss": kept, "backward_temp": bw_temp + tied_grad_temp},
        "optimizer step": {**base, "gradients": grads, "optimizer_temp": opt_temp},
    }
    if job.p > 1:
        # The loss lives on the last stage, which holds one micro-batch in flight; the first stage
        # holds the most micro-batches but no logits.
        parts["loss backward"]["activations"] = int(acts.stack)
        parts["block backward"]["logits_and_loss"] = 0
    return {k: {n: int(v) for n, v in ps.items()} for k, ps in parts.items()}


def _closing_assumptions(job: _Job, logits_kept: bool) -> list[str]:
    cfg, train, precision = job.cfg, job.train, job.precision
    out = []
    if job.autocast:
        out.append(f"{precision} autocast: fp32 parameters, gradients and optimizer states; fp32 residual "
                   "stream; each linear layer saves its own 16-bit input cast")
    if cfg.n_kv_head < cfg.n_head:
        out.append("grouped-query attention: K/V heads are repeated before SDPA, so saved at full width")
    if train.activation_checkpointing == "selective":
        out.append("selective checkpointing = every other block recomputed (blocks 0, 2, 4, ...)")
    if precision == "fp8":
        out.append("fp8: linear inputs saved in 1 byte, other activations in bf16 (torchao float8 style)")
    out.append("loss: cross_entropy(logits.float()); the loop holds the logits until backward ends"
               if logits_kept else "loss: cross_entropy(logits.float())")
    return out


def _planning_job(model: ModelConfig, train: TrainConfig, parallel: ParallelConfig | None) -> _Job:
    cfg = model.resolved() if model.n_layer is None or model.d_ff is None else model
    parallel = planning_layout(parallel or ParallelConfig())
    train = planning_train(train)
    validate(cfg, train, parallel)
    if train.precision not in ("fp32", "bf16", "fp16", "fp8"):
        raise ValueError(f"train.precision: unknown precision {train.precision!r}; choose fp32, bf16, fp16 or fp8")
    return _Job(cfg, train, parallel)


def estimate_memory(model: ModelConfig, train: TrainConfig, parallel: ParallelConfig | None = None,
                    capacity_bytes: int = 0, fused_optimizer: bool = True,
                    logits_kept: bool = True, states: dict | None = None) -> MemoryEstimate:
    """Per-GPU memory of one training step (the rank holding the most), in bytes.

    model: resolved or not (resolved here). capacity_bytes: the GPU's memory, for `fits`.
    fused_optimizer: fused AdamW (no per-parameter temporaries); False models the single-tensor
    loop, whose largest temporary is one parameter's worth of fp32. logits_kept: the training loop
    holds the logits tensor until backward finishes (as `logits = model(x); loss = ...;
    loss.backward()` does). states: model-state bytes ({"weights", "gradients",
    "optimizer_states"}) that replace full training's, for fine-tuning with a frozen base
    (`gptforge.plan.finetune_memory`); the frozen head then gets no gradient.

    Peak = max over four phases of live tensor bytes:
      loss backward:   states + stored activations + lm_head copy + logits, log-softmax and their grads
      block backward:  states + stored activations + one block's recompute and backward temporaries
      end of backward: states + all gradients
      optimizer step:  weights + gradients + optimizer states + optimizer temporaries
    then total = peak + comm buckets + CUDA context + allocator margin. Each term is one function
    of this module (`model_state_bytes`, `block_activation_bytes`, ...), with its source.

    Raises:
        ValueError: inconsistent layout (see `validate`), unknown optimizer or precision.
    """
    job = _planning_job(model, train, parallel)
    assumptions: list[str] = []
    ms = model_state_bytes(job)
    cpu = ms.cpu_offload
    acts = block_activation_bytes(job, assumptions)
    other = other_activation_bytes(job)
    copies, copy_block = autocast_copy_bytes(job, acts.n_stored)
    logits = logits_loss_bytes(job, logits_kept)
    bw_temp = backward_temp_bytes(job, acts, copy_block)
    opt_temp = optimizer_temp_bytes(job, fused_optimizer)
    if states is not None:
        ms = _ModelStates(states["weights"], states["gradients"], states["optimizer_states"], ms.cpu_offload)
    phase_parts = _phase_parts(job, ms, acts, other, copies, logits, bw_temp, opt_temp, frozen_head=states is not None)
    phases = {k: sum(parts.values()) for k, parts in phase_parts.items()}
    peak_phase = max(phases, key=phases.get)
    peak = int(phases[peak_phase])
    comm = comm_buffer_bytes(job, assumptions)
    world = job.parallel.world_size
    context = CUDA_CONTEXT_BYTES + (NCCL_BYTES if world > 1 else 0)
    assumptions.append(f"CUDA context and library handles: {CUDA_CONTEXT_BYTES // MiB} MiB per process"
                       + (f", NCCL buffers {NCCL_BYTES // MiB} MiB" if world > 1 else ""))
    margin = int(ALLOCATOR_MARGIN_FRACTION * (peak + comm))
    assumptions.append(f"caching allocator margin: {ALLOCATOR_MARGIN_FRACTION:.0%} of allocated bytes "
                       "(block rounding and fragmentation)")
    assumptions += _closing_assumptions(job, logits_kept)
    total = peak + comm + context + margin
    stored = (acts.layer_input if acts.n_stored == 0 else acts.per_layer) if job.layers_per_stage else 0
    return MemoryEstimate(
        param_count=param_count(job.cfg), weights=ms.weights, gradients=ms.gradients,
        optimizer_states=ms.optimizer_states, activations_per_layer=acts.per_layer,
        activations_per_layer_stored=stored, activations=acts.in_flight, other_activations=other,
        autocast_weight_copies=copies, logits_and_loss=logits[1], backward_temp=bw_temp, optimizer_temp=opt_temp,
        comm_buckets=comm, cuda_context=context, allocator_margin=margin, peak_tensor_bytes=peak, total=total,
        peak_phase=peak_phase, phases=phases, peak_parts=phase_parts[peak_phase], capacity=capacity_bytes,
        fits=(total <= capacity_bytes) if capacity_bytes else None, cpu_offload_bytes=cpu, assumptions=assumptions,
    )
