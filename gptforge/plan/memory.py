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


def act_bytes(precision: str) -> int:
    """Bytes per element of activations saved in the compute dtype (fp32: 4; bf16/fp16/fp8: 2)."""
    return 4 if precision == "fp32" else 2


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


def korthikanti_bytes_per_layer(s: int, b: int, h: int, a: int, t: int = 1, sequence_parallel: bool = False,
                                recompute: str = "none") -> float:
    """Activation bytes per transformer layer, Korthikanti et al. 2022, table 2 (16-bit activations,
    dropout masks of 1 byte, GELU MLP of width 4h, softmax materialised).

    recompute none:      sbh(10 + 24/t + 5as/(ht))       (t=1: sbh(34 + 5as/h))
                         with sequence parallel: sbh(34/t + 5as/(ht))
    recompute selective: sbh(10 + 24/t); with sequence parallel sbh(34/t)
    recompute full:      2sbh (only the layer input is kept)

    Example (section 5, GPT-3 175B, s=2048, h=12288, a=96, t=8): tensor parallel only 23*sbh;
    tensor + sequence parallel with selective recompute 4.25*sbh.
    """
    sbh = s * b * h
    attn_quadratic = 5.0 * a * s / (h * t)
    if recompute == "full":
        return 2.0 * sbh
    if recompute == "selective":
        attn_quadratic = 0.0
    elif recompute != "none":
        raise ValueError(f"recompute must be none, selective or full, got {recompute!r}")
    linear = 34.0 / t if sequence_parallel else 10.0 + 24.0 / t
    return sbh * (linear + attn_quadratic)


@dataclass
class LayerActivations:
    """Bytes one transformer block keeps for backward, by part (one micro-batch, one rank)."""

    norms: int = 0
    """Block input and post-attention residual (fp32) saved by the two norms, their statistics,
    RMSNorm's normalised input, and in fp32 the norm outputs."""
    linear_inputs: int = 0
    """Inputs saved by the linear layers: under autocast each linear casts its input separately."""
    attention: int = 0
    """Q, K, V, the attention output and logsumexp (SDPA); with eager attention also the (s, s)
    probabilities; the o_proj input when it is a copy."""
    mlp: int = 0
    """MLP inner activations (GELU: up output and GELU output; SwiGLU: gate, silu, up, product)."""
    dropout_masks: int = 0
    """1-byte masks of the residual and MLP dropouts (and attention dropout under eager attention)."""

    @property
    def total(self) -> int:
        return self.norms + self.linear_inputs + self.attention + self.mlp + self.dropout_masks


def layer_activation_bytes(cfg: ModelConfig, precision: str, micro_batch_size: int, seq_len: int | None = None,
                           tp: int = 1, sequence_parallel: bool = True) -> LayerActivations:
    """Bytes gptforge's Block keeps for backward without recomputation (Korthikanti table 2, adapted).

    Shapes: activations (b, s, h), MLP (b, s, d_ff), attention probabilities (b, a, s, s). With
    tensor parallelism t, heads and d_ff are split over t (Megatron column/row split), norms and the
    residual stream over the sequence when `sequence_parallel` (Korthikanti sec. 4.2.2); the input
    each linear saves after the sequence all-gather stays full size, as DTensor's ColwiseParallel
    keeps it (Megatron instead re-gathers in backward).

    Raises:
        ValueError: t does not divide n_head or d_ff.
    """
    b = micro_batch_size
    s = seq_len or cfg.block_size
    h, a, f = cfg.d_model, cfg.n_head, cfg.d_ff
    if a % tp or f % tp or cfg.n_kv_head % tp and tp % cfg.n_kv_head:
        raise ValueError(f"parallel.tp={tp} must divide model.n_head ({a}) and model.d_ff ({f})")
    e = act_bytes(precision)
    autocast = precision != "fp32"
    llama = cfg.arch == "llama"
    gated = llama and cfg.activation != "relu2"  # SwiGLU (relu2 blocks have no gate)
    bs, sbh = b * s, b * s * h
    seq_shard = tp if sequence_parallel else 1
    out = LayerActivations()

    # Norm regions (the residual stream is fp32 under autocast: embeddings and params are fp32).
    n_consumers = (3, 2 if gated else 1)  # attention norm feeds q,k,v; MLP norm feeds up (+gate)
    for consumers in n_consumers:
        region = 4 * sbh + 2 * 4 * bs  # input x + mean/rstd (LayerNorm) or x + rsqrt (RMSNorm)
        if llama:
            region = 4 * sbh + 4 * bs + 4 * sbh  # x, rsqrt, normalised x (saved by "* weight")
        if not autocast:
            region += 4 * sbh  # norm output, shared by the linears (no casts in fp32)
        out.norms += region // seq_shard
        if autocast:
            lin_e = 1 if precision == "fp8" else e
            out.linear_inputs += consumers * lin_e * sbh
    # Attention: q, k, v as SDPA sees them. The model repeats K/V heads for grouped-query
    # attention before SDPA, so K and V are saved at full width.
    qkv = 3 * e * sbh // tp
    if cfg.attention == "eager":
        probs = b * (a // tp) * s * s
        att = probs * 4 + (probs * e if e != 4 else 0) + s * s  # fp32 softmax, cast for @V, bool mask
        out.attention += qkv + att + e * sbh // tp  # + the (b, a, s, hd) output
        out.attention += e * sbh // tp  # transpose+reshape of a (b,a,s,hd)-contiguous output copies
        if cfg.dropout > 0:
            out.dropout_masks += probs
    else:
        out.attention += qkv + e * sbh // tp + 4 * b * (a // tp) * s  # + output, + logsumexp (fp32)
        if llama:
            # RoPE's torch.cat leaves q in (b, a, s, hd) layout, so the output follows it and the
            # reshape for o_proj copies.
            out.attention += e * sbh // tp
    if cfg.qk_norm:
        # RMSNorm over each head's q and k in fp32: the input, the normalised value, one rsqrt
        # per head and position.
        kv_w = cfg.n_kv_head * cfg.head_dim
        out.attention += (2 * 4 * (sbh + b * s * kv_w) + 4 * bs * (a + cfg.n_kv_head)) // tp
    # MLP: SwiGLU keeps gate, up, silu(gate) and their product; gelu/relu2 the up output and the
    # activation's output.
    bsf = b * s * f // tp
    out.mlp += (4 if gated else 2) * e * bsf
    if cfg.dropout > 0:
        out.dropout_masks += 2 * sbh // seq_shard
    return out


def _recompute_split(n_layer: int, mode: str) -> tuple[int, int]:
    """(layers checkpointed, layers stored) for activation_checkpointing none/selective/full.

    selective: every other block checkpointed, blocks 0, 2, 4, ... (torchtitan's per-layer
    selective AC with frequency 2), i.e. ceil(L/2) of them.
    """
    if mode == "none":
        return 0, n_layer
    if mode == "full":
        return n_layer, 0
    if mode == "selective":
        k = (n_layer + 1) // 2
        return k, n_layer - k
    raise ValueError(f"train.activation_checkpointing: unknown value {mode!r}; choose none, selective or full")


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



def estimate_memory(model: ModelConfig, train: TrainConfig, parallel: ParallelConfig | None = None,
                    capacity_bytes: int = 0, fused_optimizer: bool = True,
                    logits_kept: bool = True, states: dict | None = None) -> MemoryEstimate:
    """Per-GPU memory of one training step (the rank holding the most), in bytes.

    model: resolved or not (resolved here). capacity_bytes: the GPU's memory, for `fits`.
    fused_optimizer: fused AdamW (no per-parameter temporaries); False models the single-tensor
    loop, whose largest temporary is one parameter's worth of fp32. logits_kept: the training loop
    holds the logits tensor until backward finishes (as `logits = model(x); loss = ...;
    loss.backward()` does).

    Peak = max over four phases of live tensor bytes:
      loss backward:   states + stored activations + lm_head copy + logits, log-softmax and their grads
      block backward:  states + stored activations + one block's recompute and backward temporaries
      end of backward: states + all gradients
      optimizer step:  weights + gradients + optimizer states + optimizer temporaries
    then total = peak + comm buckets + CUDA context + allocator margin.

    Raises:
        ValueError: inconsistent layout (see `validate`), unknown optimizer or precision.
    """
    cfg = model.resolved() if model.n_layer is None or model.d_ff is None else model
    parallel = planning_layout(parallel or ParallelConfig())
    train = planning_train(train)
    validate(cfg, train, parallel)
    precision = train.precision
    if precision not in ("fp32", "bf16", "fp16", "fp8"):
        raise ValueError(f"train.precision: unknown precision {precision!r}; choose fp32, bf16, fp16 or fp8")
    e = act_bytes(precision)
    autocast = precision != "fp32"
    L, h, V = cfg.n_layer, cfg.d_model, cfg.vocab_size
    b, s = train.micro_batch_size, cfg.block_size
    t, p = parallel.tp, parallel.pp
    stage = parallel.effective_zero_stage()
    nd = parallel.shard_degree() if stage > 0 else 1
    offload = parallel.offload
    assumptions: list[str] = []

    shapes = param_shapes(cfg)
    n_total = param_count(cfg)
    n_block = block_param_count(cfg)
    block_matrix = sum(x.numel for x in block_param_shapes(cfg) if x.is_matrix)
    n_embed = sum(x.numel for x in shapes if x.role == "embedding")
    n_head_only = sum(x.numel for x in shapes if x.role == "head")
    n_final = sum(x.numel for x in shapes if x.role == "final_norm")

    # Parameters on the busiest rank: blocks split over pp stages and tp; embeddings and head are
    # vocab-parallel under tp; with pp the first stage holds the embedding, the last the head (a
    # tied embedding is held by both).
    layers_per_stage = math.ceil(L / p)
    wte = V * h
    if p == 1:
        local = layers_per_stage * n_block / t + n_embed / t + n_head_only / t + n_final
    else:
        first = layers_per_stage * n_block / t + n_embed / t
        last = layers_per_stage * n_block / t + (n_head_only or wte) / t + n_final
        local = max(first, last)
    local = int(local)
    opt_full = optimizer_state_bytes(cfg, train.optimizer, shapes) * local // max(n_total, 1)

    weights = 4 * local
    grads = 4 * local
    opt = opt_full
    if stage >= 1:
        opt = opt_full // nd
    if stage >= 2:
        grads = grads // nd
    if stage >= 3:
        weights = weights // nd
    cpu = 0
    if offload in ("optimizer", "optimizer+params"):
        cpu += opt
        opt = 0
    if offload == "optimizer+params":
        cpu += weights + grads
        weights, grads = 0, 0

    # Activations of one block, stored per checkpointing mode.
    per_layer = layer_activation_bytes(cfg, precision, b, s, tp=t, sequence_parallel=t > 1)
    layer_input = 4 * b * s * h // t  # fp32 residual kept by a checkpointed block
    n_ckpt, n_stored = _recompute_split(layers_per_stage, train.activation_checkpointing)
    stack = n_ckpt * layer_input + n_stored * per_layer.total
    # Pipeline: micro-batches in flight on the first stage (Korthikanti sec. 4.2.3; Narayanan et
    # al. 2021 for 1F1B and interleaving).
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
    activations = int(stack * in_flight)

    # Outside the blocks: embedding output (saved by block 0's norm, counted there), final norm
    # and the lm_head input, RoPE tables.
    bsh = b * s * h // t
    if cfg.arch == "llama":
        final = 4 * bsh + 4 * b * s + 4 * bsh + (e if autocast else 4) * bsh
        final += 2 * s * cfg.head_dim * 4  # cos, sin (s, hd/2) gathered per step
    else:
        final = 4 * bsh + 8 * b * s + (e if autocast else 4) * bsh
    other = int(final)

    # Autocast keeps a 16-bit copy of every weight matrix it casts (blocks and lm_head; the
    # embedding lookup is not cast). FSDP2 with a bf16 MixedPrecisionPolicy gathers bf16 weights
    # instead, counted in comm_buckets.
    # A checkpointed block's forward runs without saving anything, so its copies are dropped.
    copies = 0
    copy_block = 2 * block_matrix // t if autocast and stage < 3 else 0
    if autocast and stage < 3:
        copies = int(n_stored * copy_block + 2 * wte / t)

    # Logits and loss (last stage). Cross-entropy on logits.float(): the log-softmax output is
    # saved (fp32); in backward the gradient of the log-softmax and of the logits exist together.
    bsv = b * s * V // t
    logits_kept_bytes = (e if autocast else 4) * bsv if logits_kept else 0
    logits_loss = logits_kept_bytes + 4 * bsv + 8 * bsv
    if cfg.logit_softcap:
        logits_loss += 4 * bsv  # tanh's fp32 output, saved for its backward

    # Transients of one block's backward: gradients of its activations, and with recomputation
    # the recomputed forward of that block.
    f_local = b * s * cfg.d_ff // t
    bw_temp = 2 * 4 * bsh + (3 if cfg.arch == "llama" and cfg.activation != "relu2" else 2) * e * f_local
    if n_ckpt:
        bw_temp += per_layer.total + copy_block

    # Optimizer temporaries.
    opt_temp = 0
    if not fused_optimizer and train.optimizer in ("adamw", "sgd"):
        largest = max(x.numel for x in shapes)
        opt_temp = 4 * largest // t
    if train.optimizer == "muon":
        # torch.optim.Muon works one matrix at a time: the fp32 Nesterov update, its bf16
        # Newton-Schulz iterate and next iterate, and two bf16 (min dim)^2 Gram products.
        mats = [x for x in shapes if is_muon_param(x)]
        if mats:
            big = max(mats, key=lambda x: x.numel)
            opt_temp = (4 * big.numel + 2 * 2 * big.numel + 2 * 2 * min(big.shape) ** 2) // t

    # Fine-tuning with frozen base weights (gptforge.plan.finetune_memory): its model states
    # replace full training's, and the frozen head gets no gradient.
    frozen_head = states is not None
    if states is not None:
        weights, grads, opt = states["weights"], states["gradients"], states["optimizer_states"]
    # Gradients resident during backward: with accumulation, earlier micro-batches' gradients.
    grads_during = grads if (train.gradient_accumulation_steps > 1 or p > 1) else 0
    # lm_head's weight gradient exists once the loss backward is done.
    head_grad = 0 if frozen_head else 4 * wte // t
    # Tied embeddings: the embedding's dense gradient arrives after lm_head's and is summed into a
    # new tensor, so two more (V, h) fp32 buffers exist at the very end of backward.
    tied_grad_temp = 2 * head_grad if cfg.tie_embeddings else 0
    base = {"weights": weights, "optimizer_states": opt}
    phase_parts = {
        "loss backward": {**base, "gradients": grads_during, "activations": activations,
                          "other_activations": other, "autocast_weight_copies": copies,
                          "logits_and_loss": logits_loss},
        "block backward": {**base, "gradients": grads_during or head_grad, "activations": activations,
                           "other_activations": other, "autocast_weight_copies": copies,
                           "logits_and_loss": logits_kept_bytes, "backward_temp": bw_temp},
        "end of backward": {**base, "gradients": grads, "other_activations": other,
                            "logits_and_loss": logits_kept_bytes, "backward_temp": bw_temp + tied_grad_temp},
        "optimizer step": {**base, "gradients": grads, "optimizer_temp": opt_temp},
    }
    if p > 1:
        # The loss lives on the last stage, which holds one micro-batch in flight; the first stage
        # holds the most micro-batches but no logits.
        phase_parts["loss backward"]["activations"] = int(stack)
        phase_parts["block backward"]["logits_and_loss"] = 0
    phase_parts = {k: {n: int(v) for n, v in parts.items()} for k, parts in phase_parts.items()}
    phases = {k: sum(parts.values()) for k, parts in phase_parts.items()}
    peak_phase = max(phases, key=phases.get)
    peak = int(phases[peak_phase])

    # Communication buffers.
    comm = 0
    if stage == 3:
        comm += int(2 * n_block / t * e) + int(2 * n_block / t * 4)
        comm += int(wte / t * e)
        assumptions.append("FSDP2 (ZeRO-3): two blocks gathered at a time (current + prefetch) in the compute "
                           "dtype, two blocks' fp32 gradients awaiting reduce-scatter, the embedding gathered")
    elif parallel.dp > 1:
        comm += 2 * DDP_BUCKET_BYTES
        assumptions.append("data parallel gradient buckets: 2 x 25 MiB in flight (DDP bucket_cap_mb default, "
                           "gradient_as_bucket_view=True)")
    if t > 1 or p > 1:
        comm += 2 * 4 * bsh
        assumptions.append("tensor/pipeline parallel: two (b, s, h) fp32 communication buffers")
    world = parallel.world_size
    context = CUDA_CONTEXT_BYTES + (NCCL_BYTES if world > 1 else 0)
    assumptions.append(f"CUDA context and library handles: {CUDA_CONTEXT_BYTES // MiB} MiB per process"
                       + (f", NCCL buffers {NCCL_BYTES // MiB} MiB" if world > 1 else ""))
    margin = int(ALLOCATOR_MARGIN_FRACTION * (peak + comm))
    assumptions.append(f"caching allocator margin: {ALLOCATOR_MARGIN_FRACTION:.0%} of allocated bytes "
                       "(block rounding and fragmentation)")
    if autocast:
        assumptions.append(f"{precision} autocast: fp32 parameters, gradients and optimizer states; fp32 residual "
                           "stream; each linear layer saves its own 16-bit input cast")
    if cfg.n_kv_head < cfg.n_head:
        assumptions.append("grouped-query attention: K/V heads are repeated before SDPA, so saved at full width")
    if train.activation_checkpointing == "selective":
        assumptions.append("selective checkpointing = every other block recomputed (blocks 0, 2, 4, ...)")
    if precision == "fp8":
        assumptions.append("fp8: linear inputs saved in 1 byte, other activations in bf16 (torchao float8 style)")
    assumptions.append("loss: cross_entropy(logits.float()); the loop holds the logits until backward ends"
                       if logits_kept else "loss: cross_entropy(logits.float())")
    total = peak + comm + context + margin
    return MemoryEstimate(
        param_count=n_total,
        weights=weights,
        gradients=grads,
        optimizer_states=opt,
        activations_per_layer=per_layer.total,
        activations_per_layer_stored=(layer_input if n_stored == 0 else per_layer.total) if layers_per_stage else 0,
        activations=activations,
        other_activations=other,
        autocast_weight_copies=copies,
        logits_and_loss=logits_loss,
        backward_temp=bw_temp,
        optimizer_temp=opt_temp,
        comm_buckets=comm,
        cuda_context=context,
        allocator_margin=margin,
        peak_tensor_bytes=peak,
        total=total,
        peak_phase=peak_phase,
        phases=phases,
        peak_parts=phase_parts[peak_phase],
        capacity=capacity_bytes,
        fits=(total <= capacity_bytes) if capacity_bytes else None,
        cpu_offload_bytes=cpu,
        assumptions=assumptions,
    )
