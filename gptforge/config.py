"""Typed configuration: plain dataclasses are the single source of truth.

A YAML recipe (`--config recipe.yaml`) and dotted command-line overrides (`--train.lr 3e-4`) fill
them through jsonargparse (`gptforge.options.command_parser`), so each field's docstring is its `--help` text. Unknown keys are errors
that name the key and its nearest valid spelling (see `parse`).

`ModelConfig` fields default to None, meaning "take it from the preset, else the default": that
is how `--model.preset gpt2-small --model.n_layer 6` can mean "gpt2-small with 6 layers". Call
`ModelConfig.resolved()` to get a config with every field filled.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Optional, Union

# ---------------------------------------------------------------------------------------------
# Model


@dataclass
class ModelConfig:
    """Shape of the decoder. None means: from `preset`, else the documented default."""

    preset: Optional[str] = None
    """Named shape (gpt2-nano, gpt2-micro, gpt2-mini, gpt2-small, gpt2-medium, gpt2-large, gpt2-xl,
    qwen3-nano, qwen3-micro, qwen3-mini, qwen3-small (the recommended recipe: exports exactly to hf,
    gguf and onnx), modern-nano, modern-micro, modern-mini, modern-small (opt-in, NOT exportable:
    logit soft cap and relu2 MLP), llama-nano, llama-micro, llama-60m, llama-160m, llama-2-7b,
    llama-2-13b, llama-2-70b, llama-3-8b, llama-3-70b). Other model.* keys override it."""
    arch: Optional[Literal["gpt2", "llama"]] = None
    """Block type: gpt2 (learned positions, LayerNorm, GELU) or llama (RoPE, RMSNorm, SwiGLU, GQA).
    Default gpt2."""
    n_layer: Optional[int] = None
    """Number of transformer blocks. Default 4."""
    n_head: Optional[int] = None
    """Number of query heads. Default 4."""
    n_kv_head: Optional[int] = None
    """Number of key/value heads (grouped-query attention); must divide n_head. Default n_head."""
    d_model: Optional[int] = None
    """Hidden size (embedding width). Default 128."""
    d_ff: Optional[int] = None
    """MLP inner width. Default 4*d_model for gpt2; for llama 8/3*d_model rounded up to a multiple
    of 16."""
    block_size: Optional[int] = None
    """Context length in tokens (seq_len). Default 256."""
    vocab_size: Optional[int] = None
    """Vocabulary size. With --data, taken from the data's tokenizer unless set."""
    dropout: Optional[float] = None
    """Dropout probability on attention weights, residual branches and embeddings. Default 0."""
    bias: Optional[bool] = None
    """Biases in linear layers and LayerNorm. Default True for gpt2, False for llama."""
    qkv_bias: Optional[bool] = None
    """Biases on the q/k/v projections only (Qwen2 style). Default: same as `bias`."""
    tie_embeddings: Optional[bool] = None
    """Share the token embedding with the output head. Default True for gpt2, False for llama."""
    norm_eps: Optional[float] = None
    """Epsilon of LayerNorm/RMSNorm. Default 1e-5."""
    rope_theta: Optional[float] = None
    """RoPE base frequency (llama). Default 10000."""
    activation: Optional[Literal["gelu", "gelu_tanh", "relu2"]] = None
    """MLP nonlinearity. gpt2 blocks: gelu (exact, erf; as nanoGPT) or gelu_tanh (the tanh
    approximation of the original GPT-2 and Hugging Face's "gelu_new"); llama blocks use SwiGLU
    with either of those values. relu2, both families: down(relu(up(x))^2), no gate (squared
    ReLU, So et al. 2021 "Primer", section 3; the modded-nanogpt speedrun's MLP); d_ff then
    defaults to 4*d_model (relu2 on llama blocks is not exportable). Default gelu (its forward and
    backward measured 1.25x faster than gelu_tanh's in fp32 and 2.1x in bf16 on a 2-core AVX-512
    CPU, bench/RESULTS.md; the gguf export writes it for llama.cpp's tanh GELU with a note)."""
    qk_norm: Optional[bool] = None
    """RMSNorm (learned gain, one per head dim) on each head's query and key before RoPE and the
    dot product (Henry et al. 2020 "Query-Key Normalization"; Dehghani et al. 2023, ViT-22B,
    section 2; as Qwen3 and the modded-nanogpt speedrun). Default False."""
    zero_init_proj: Optional[bool] = None
    """Initialise the attention-output (o_proj) and MLP-output (down_proj) weights to zero, so
    every block is the identity at step 0 (Zhang et al. 2019 "Fixup"; modded-nanogpt). Default
    False (GPT-2's N(0, 0.02/sqrt(2*n_layer)))."""
    logit_softcap: Optional[float] = None
    """Soft cap c on the output logits: c * tanh(z / c), so |logit| < c (Gemma 2, Team 2024,
    section 2, final_logit_softcapping 30; modded-nanogpt uses 15 at GPT-2-small scale). 0 or
    unset: off. Not exportable (no hf / gguf architecture gptforge writes caps only the logits)."""
    value_embeddings: Optional[bool] = None
    """Value embeddings: every other block, counting back from the last, gets its own token
    embedding table (vocab_size, n_kv_head*head_dim) added to the attention values, v = v +
    E_v[token] (Zhou et al. 2024 "Value Residual Learning"; the modded-nanogpt speedrun and
    nanochat). Adds ceil(n_layer/2) * vocab_size * kv width parameters. Default False."""
    rope_scaling: Optional[dict] = None
    """RoPE frequency scaling for long context (llama), as in Hugging Face configs: None (plain
    RoPE), {"rope_type": "linear", "factor": f} (position interpolation), or {"rope_type": "llama3",
    "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"} (Llama 3.1).
    Default None."""
    attention: Optional[Literal["sdpa", "eager"]] = None
    """Attention kernel: sdpa (torch scaled_dot_product_attention) or eager (explicit softmax,
    materialises the (T, T) score matrix). Default sdpa."""
    head_size: Optional[int] = None
    """Width of one attention head. Default d_model / n_head; `gptforge prune` sets it when it
    prunes heads and embedding channels separately (attention width n_head * head_size then
    differs from d_model)."""

    def resolved(self) -> "ModelConfig":
        """Return a copy with every field filled: preset values, then explicit fields, then defaults.

        Raises:
            ValueError: unknown preset (with the nearest name), or inconsistent shapes
                (d_model not divisible by n_head, n_head not divisible by n_kv_head).
        """
        from gptforge.presets import PRESETS

        values: dict[str, Any] = {}
        if self.preset is not None:
            if self.preset not in PRESETS:
                raise ValueError(
                    f"model.preset: unknown preset {self.preset!r}{_did_you_mean(self.preset, PRESETS)}; "
                    f"choose one of {', '.join(PRESETS)}"
                )
            values.update(PRESETS[self.preset])
        for f in fields(self):
            v = getattr(self, f.name)
            if v is not None:
                values[f.name] = v
        arch = values.setdefault("arch", "gpt2")
        values.setdefault("n_layer", 4)
        values.setdefault("n_head", 4)
        values.setdefault("n_kv_head", values["n_head"])
        values.setdefault("d_model", 128)
        if "d_ff" not in values:
            if arch == "gpt2" or values.get("activation") == "relu2":
                values["d_ff"] = 4 * values["d_model"]
            else:
                values["d_ff"] = int(math.ceil(8 * values["d_model"] / 3 / 16) * 16)
        values.setdefault("block_size", 256)
        values.setdefault("vocab_size", 50257)
        values.setdefault("dropout", 0.0)
        values.setdefault("bias", arch == "gpt2")
        values.setdefault("qkv_bias", values["bias"])
        values.setdefault("tie_embeddings", arch == "gpt2")
        values.setdefault("norm_eps", 1e-5)
        values.setdefault("rope_theta", 10000.0)
        values.setdefault("activation", "gelu")
        values.setdefault("attention", "sdpa")
        values.setdefault("qk_norm", False)
        values.setdefault("zero_init_proj", False)
        values.setdefault("logit_softcap", 0.0)
        values.setdefault("value_embeddings", False)
        out = ModelConfig(**values)
        for name in ("n_layer", "n_head", "n_kv_head", "d_model", "d_ff", "block_size", "vocab_size"):
            if getattr(out, name) < 1:
                raise ValueError(f"model.{name} must be >= 1, got {getattr(out, name)}")
        if not 0.0 <= out.dropout < 1.0:
            raise ValueError(f"model.dropout must be in [0, 1), got {out.dropout}")
        if out.head_size is not None and out.head_size < 1:
            raise ValueError(f"model.head_size must be >= 1, got {out.head_size}")
        if out.head_size is None and out.d_model % out.n_head:
            raise ValueError(f"model.d_model ({out.d_model}) must be divisible by model.n_head ({out.n_head})")
        if out.n_head % out.n_kv_head:
            raise ValueError(f"model.n_head ({out.n_head}) must be divisible by model.n_kv_head ({out.n_kv_head})")
        if out.logit_softcap < 0:
            raise ValueError(f"model.logit_softcap must be >= 0 (0: off), got {out.logit_softcap}")
        if out.arch == "llama" and out.head_dim % 2:
            raise ValueError("llama (RoPE) needs an even head dimension (d_model/n_head or head_size)")
        return out

    @property
    def head_dim(self) -> int:
        """Width of one attention head: head_size, else d_model // n_head."""
        return self.head_size or self.d_model // self.n_head


# ---------------------------------------------------------------------------------------------
# Training


@dataclass
class TrainConfig:
    """Optimisation, schedule, precision, evaluation and checkpointing."""

    max_steps: int = 1000
    """Number of optimizer steps."""
    micro_batch_size: int = 8
    """Sequences per forward/backward pass (per data-parallel rank)."""
    gradient_accumulation_steps: int = 1
    """Micro-batches per optimizer step. global_batch_size = micro_batch_size *
    gradient_accumulation_steps * dp."""
    global_batch_size: Optional[int] = None
    """Sequences per optimizer step over all data-parallel ranks. Set: gradient_accumulation_steps
    becomes global_batch_size / (micro_batch_size * dp), so the same run keeps its batches on any
    number of processes. Unset: micro_batch_size * gradient_accumulation_steps * dp, recorded in
    config.yaml (a resume on another number of processes then keeps it)."""
    lr: Optional[float] = None
    """Peak learning rate (AdamW's; with muon, that of the embeddings, head, norms and biases).
    Unset: derived from model.d_model when the run is resolved (gptforge.train.resolve; 0.0016 *
    (128 / d_model)^0.6, fitted on CPU runs, gptforge.train.optim.default_lr); on resume, the
    checkpoint's value."""
    min_lr: Optional[float] = None
    """Learning rate at the end of decay. Unset: lr / 10."""
    warmup_steps: Optional[int] = None
    """Linear warmup steps from 0 to lr. Unset: 5% of max_steps (after a time budget has set
    it), at least 10 and at most 1000 (and at most a quarter of the run)."""
    lr_schedule: Literal["cosine", "linear", "constant", "wsd"] = "cosine"
    """After warmup: cosine or linear decay to min_lr, constant, or warmup-stable-decay."""
    schedule_start: int = 0
    """Step at which the schedule (warmup, then decay) starts: lr_at(step) is the schedule of a
    run of max_steps - schedule_start steps evaluated at step - schedule_start (steps before it
    get the schedule's first value). Set it to the resume step to continue a run with a fresh
    schedule, e.g. a WSD cooldown from any checkpoint (`--train.lr_schedule wsd
    --train.decay_fraction 1 --train.warmup_steps 0 --train.schedule_start S`). 0: from step 0."""
    decay_fraction: float = 0.2
    """wsd only: fraction of max_steps spent in the final linear decay."""
    weight_decay: float = 0.1
    """AdamW weight decay, applied to matrices only (not biases, norm weights)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.95
    """AdamW beta2."""
    eps: float = 1e-8
    """AdamW epsilon."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; 0 disables clipping."""
    optimizer: Literal["adamw", "sgd", "muon", "adamw8bit", "adafactor"] = "adamw"
    """Optimizer. adamw (fused where the device supports it) and sgd run everywhere; muon:
    torch.optim.Muon (Newton-Schulz orthogonalised momentum, Jordan et al. 2024) for the 2-D
    matrices inside the blocks and AdamW (train.lr, betas, weight_decay) for embeddings, head,
    norms and biases; single process, DDP and pipeline parallel (not FSDP2, TP or ZeRO-1).
    adamw8bit and adafactor are planner-only here."""
    muon_lr: Optional[float] = None
    """muon: peak learning rate of the Muon matrices (scaled by the schedule like lr, so the
    ratio muon_lr / lr stays fixed); torch.optim.Muon also multiplies it by sqrt(max(1,
    rows/cols)) per matrix (Jordan et al. 2024, the "original" adjustment). Default 0.02 (the
    reference Muon implementation's)."""
    muon_momentum: float = 0.95
    """muon: Nesterov momentum of the Muon matrices (reference value 0.95)."""
    muon_weight_decay: float = 0.0
    """muon: decoupled weight decay of the Muon matrices (the matrices shrink by
    lr_muon * muon_weight_decay per step); the AdamW parameters keep weight_decay."""
    data_weights: Optional[dict[str, float]] = None
    """Mixture weights over the data's sources (several --data folders, or a folder prepared with
    several --source): name=weight, normalized to sum to 1, 0 leaves a source out (shortcut
    `--data-weights en=0.7,zh=0.3`). Unset: proportional to each source's train tokens (resolved
    once; on --resume the run's own). Every optimizer step draws each source's share of its
    global batch from a seeded stratified sampler (gptforge.data.mixture). One source: unused."""
    stages: Optional[list[dict[str, Any]]] = None
    """Mixture stages, in order: each {until_step: N or until_fraction: F (of max_steps),
    data_weights: {name: weight}}; steps before a stage's end (and after the previous stage's)
    draw with its weights, later steps with train.data_weights. The lr schedule stays one schedule
    (a WSD decay can lie inside the last stage). Resolved once to until_step values."""
    document_mask: bool | None = None
    """None (default): off, resolved once (gptforge.train.resolve; on --resume the run's own value;
    bench/RESULTS.md: it did not win at the quickstart size). True - token shards only: attention stays inside each document of a packed training window (a
    block-diagonal causal mask from the EOS positions, an EOS opening the document after it) and
    positions restart at 0 at each EOS, so a document is modelled as if it were alone; validation
    uses the same mask (gptforge.model.gpt.document_mask), as does `gptforge evaluate` of the run.
    Not under pipeline parallelism. (Packed instruction data always masks per example.)"""
    precision: Literal["auto", "fp32", "bf16", "fp16", "fp8"] = "auto"
    """Autocast precision: auto (what is fast on the device: bf16 on GPUs that have it and on CPUs
    whose measured bf16 matmuls beat fp32, else fp32; the choice is frozen in config.yaml), fp32,
    bf16 or fp16 (with a gradient scaler). fp8 is planner-only."""
    eval_interval: int = 100
    """Evaluate on the val split every N steps (and at the last step); 0 disables."""
    eval_steps: int = 20
    """Number of fixed val batches per evaluation."""
    patience: int = 0
    """Early stopping: stop after this many evaluations without improvement; 0 disables."""
    eval_tasks: Optional[list[str]] = None
    """Task files (gptforge evaluate --tasks formats) scored every eval_interval steps, logged as
    eval/<task>/<metric> to metrics.jsonl and TensorBoard."""
    eval_tasks_limit: Optional[int] = None
    """Score only the first N examples of each train.eval_tasks task (None: all)."""
    best_metric: str = "val_loss"
    """What picks the best checkpoint and drives early stopping: val_loss (of a mixture: the
    token-weighted mean over the sources' val splits), val/<source>/loss (one source of a
    mixture), or a task metric such as eval/<task>/acc (higher is better for accuracies and F1,
    lower for perplexities)."""
    checkpoint_interval: int = 500
    """Write a checkpoint every N steps (and at the end); 0 writes only at the end."""
    keep_checkpoints: int = 2
    """Number of recent step checkpoints kept (the best one is always kept)."""
    stop_at_step: int = 0
    """End the run at this step as if interrupted (checkpoint written); 0 disables."""
    max_minutes: float = 0.0
    """Time budget in minutes: max_steps is set from a step time measured at start (so the schedule
    completes in time; frozen in config.yaml for an exact resume) and the run stops with a
    checkpoint when the budget is used up (counted over resumes). When set, it replaces
    max_steps, an explicit --train.max_steps included (at least 20 steps; the start says so in
    one line); keep it 0 to train exactly max_steps. 0 disables."""
    max_minutes_steps: int = 0
    """Set when the run is resolved (gptforge.train.resolve): the max_steps that max_minutes resolved to
    (0: not resolved yet)."""
    max_bad_steps: int = 5
    """Stop after this many consecutive optimizer steps with a non-finite loss or gradient."""
    seed: int = 1337
    """Seed for initialisation, data sampling and dropout."""
    device: str = "auto"
    """auto (CUDA, then MPS, then CPU), cpu, cuda, cuda:N or mps."""
    activation_checkpointing: Literal["none", "selective", "full"] = "none"
    """Recompute activations in backward: none, selective (attention and MLP inner activations
    of every other block) or full (every block)."""
    compile: Union[bool, Literal["auto"]] = False
    """torch.compile each block: true, false, or auto (CUDA: true; CPU: whichever of compiled and
    eager steps runs faster for this shape, measured at start; frozen in config.yaml as true/false)."""
    log_interval: int = 1
    """Write metrics every N steps."""
    num_threads: int = 0
    """CPU threads for torch (0: leave torch's default)."""
    tensorboard: bool = True
    """Write TensorBoard event files to RUN_DIR/tb."""
    report: bool = True
    """Write RUN_DIR/report.html (gptforge report) when the run ends, however it ends."""
    spike_alarms: bool = True
    """Watch train loss and gradient norm for spikes and divergence (rolling median / MAD); alarms
    go on the progress line, into metrics.jsonl (`events`) and the report."""
    spike_action: Literal["warn", "rollback"] = "warn"
    """What a loss spike (or a streak of train.max_bad_steps non-finite steps) does: warn (an
    alarm only; the non-finite streak stops the run), or rollback: reload the last good checkpoint
    (model, optimizer, schedule, RNG), skip the batches read since it and continue, logged as a
    `rollback` event (gptforge.train.rollback). Needs train.spike_alarms; single process or plain
    DDP (parallel.dp_replicate) only."""
    max_rollbacks: int = 3
    """spike_action rollback: rollbacks allowed in the run (counted over resumes); the next spike
    after them stops the run."""
    wandb_project: Optional[str] = None
    """Weights & Biases project: log the config, every metrics row and the report (needs `pip
    install wandb`). Unset: no W&B."""
    wandb_entity: Optional[str] = None
    """W&B entity (team or user); default the account's."""
    wandb_run_name: Optional[str] = None
    """W&B run name; default the run directory's name."""
    wandb_mode: Literal["online", "offline", "disabled"] = "online"
    """W&B mode: offline writes the run under RUN_DIR/wandb for a later `wandb sync`."""

    PLANNER_ONLY = {"optimizer": ("adamw8bit", "adafactor"), "precision": ("fp8",)}
    """Values `gptforge plan` models but the trainer does not run."""

    RANGES = {"max_steps": (1, None), "micro_batch_size": (1, None), "gradient_accumulation_steps": (1, None),
              "lr": (0.0, None), "min_lr": (0.0, None), "warmup_steps": (0, None), "schedule_start": (0, None), "decay_fraction": (0.0, 1.0),
              "weight_decay": (0.0, None), "beta1": (0.0, 1.0), "beta2": (0.0, 1.0), "eps": (0.0, None),
              "grad_clip": (0.0, None), "eval_interval": (0, None), "eval_steps": (1, None), "patience": (0, None),
              "checkpoint_interval": (0, None), "keep_checkpoints": (1, None), "stop_at_step": (0, None),
              "max_minutes": (0.0, None), "max_minutes_steps": (0, None),
              "max_bad_steps": (1, None), "log_interval": (1, None), "num_threads": (0, None),
              "muon_momentum": (0.0, 1.0), "muon_weight_decay": (0.0, None), "max_rollbacks": (1, None)}
    """Allowed (min, max) of each numeric field, both inclusive; None: unbounded."""

    def check_trainable(self) -> None:
        """Refuse, before anything starts, values the trainer cannot run: a number outside its
        range (RANGES) or a planner-only optimizer/precision (PLANNER_ONLY).

        Raises:
            InputError: naming the option and the allowed range or values.
        """
        from gptforge.errors import InputError

        for name, (lo, hi) in self.RANGES.items():
            v = getattr(self, name)
            if v is None:  # unset: filled when the run is resolved (gptforge.train.resolve)
                continue
            if (lo is not None and v < lo) or (hi is not None and v > hi):
                allowed = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
                raise InputError(f"train.{name}={v!r}: must be {allowed}")
        if self.schedule_start >= self.max_steps:
            raise InputError(f"train.schedule_start={self.schedule_start}: must be below train.max_steps "
                             f"({self.max_steps}); raise max_steps to extend the run")
        if self.muon_lr is not None and self.muon_lr < 0:
            raise InputError(f"train.muon_lr={self.muon_lr!r}: must be >= 0 (or unset)")
        if self.lr is not None and self.min_lr is not None and self.min_lr > self.lr:
            raise InputError(f"train.min_lr={self.min_lr:g} is above train.lr={self.lr:g}: the schedule decays from "
                             "lr to min_lr; set min_lr <= lr")
        if self.warmup_steps is not None and self.warmup_steps > self.max_steps > 1:
            raise InputError(f"train.warmup_steps={self.warmup_steps} > train.max_steps={self.max_steps}: the "
                             "learning rate would never reach its peak; use fewer warmup steps")
        if self.global_batch_size is not None and self.global_batch_size < 1:
            raise InputError(f"train.global_batch_size={self.global_batch_size!r}: must be >= 1 (or unset)")
        if self.spike_action not in ("warn", "rollback"):
            raise InputError(f"train.spike_action={self.spike_action!r}: must be warn or rollback")
        if self.spike_action == "rollback" and not self.spike_alarms:
            raise InputError("train.spike_action=rollback acts on the spike detector's alarms, and "
                             "train.spike_alarms is false; set train.spike_alarms true, or spike_action warn")
        if self.spike_action == "rollback" and self.checkpoint_interval == 0 and self.eval_interval == 0:
            raise InputError("train.spike_action=rollback needs checkpoints to roll back to, and "
                             "train.checkpoint_interval 0 with train.eval_interval 0 writes one only at the end; "
                             "set train.checkpoint_interval (e.g. 100)")
        for name, values in self.PLANNER_ONLY.items():
            if getattr(self, name) in values:
                raise InputError(f"train.{name}={getattr(self, name)!r} is modelled by `gptforge plan` only and "
                                 "cannot be trained here; use " + ("adamw, sgd or muon" if name == "optimizer"
                                                                   else "fp32, bf16 or fp16"))


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
    offload: Literal["none", "optimizer", "optimizer+params"] = "none"
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


@dataclass
class FinetuneConfig:
    """Fine-tuning a pretrained model (`gptforge finetune`): method, adapters, data layout."""

    method: Literal["full", "lora", "qlora"] = "lora"
    """full: train every weight; lora: train low-rank adapters on frozen base weights (Hu et al.
    2021); qlora: the same adapters on a base whose block linears are stored in 4 bits by
    bitsandbytes (Dettmers et al. 2023; pip install 'gptforge[qlora]'; CPU or CUDA, single process)."""
    lora_rank: int = 8
    """LoRA adapter rank r."""
    lora_alpha: float = 16.0
    """LoRA scale numerator: the adapter's output is multiplied by lora_alpha / lora_rank."""
    lora_dropout: float = 0.0
    """Dropout on each adapter's input (training only)."""
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Linear layers that get adapters: any of q_proj, k_proj, v_proj, o_proj, gate_proj (llama),
    up_proj, down_proj, or [all]."""
    qlora_quant_type: Literal["nf4", "fp4"] = "nf4"
    """qlora: 4-bit data type of the base weights: nf4 (NormalFloat, the QLoRA paper's) or fp4."""
    qlora_double_quant: bool = True
    """qlora: also quantize the per-block scales to 8 bits (saves about 0.37 bits per weight)."""
    qlora_compute_dtype: Literal["auto", "bf16", "fp32"] = "auto"
    """qlora: dtype the 4-bit weights are dequantized to for each matmul; auto: bf16 when
    train.precision is bf16, else fp32."""
    packing: Literal["packed", "padded"] = "packed"
    """Instruction data: packed (several sequences per row, attention kept inside each, position
    ids restarting per sequence) or padded (one sequence per row, right-padded)."""
    chat_template: str = "auto"
    """Instruction data with `messages`: auto (the tokenizer's chat template when it has one, else
    gptforge's default template), default (always the default template), or the path of a Jinja
    file (used, and copied into the run directory as chat_template.jinja)."""
    block_size: Optional[int] = None
    """Training sequence length in tokens (longer examples are truncated). Default: the model's
    context length, at most 2048. The model keeps its own context length for export."""
    val_fraction: float = 0.05
    """Instruction data: fraction of examples held out for validation (0: none). Token shards use
    their val split."""
    cache: bool = True
    """Cache the tokenized instruction data beside the .jsonl (keyed on data, tokenizer, template)."""


# ---------------------------------------------------------------------------------------------
# Helpers


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def to_dict(obj) -> Any:
    """Dataclass (nested) -> plain dict, for YAML/JSON."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def from_dict(cls, data: dict, where: str = ""):
    """Plain dict -> dataclass `cls`, rejecting unknown keys with the nearest valid spelling.

    Raises:
        ValueError: an unknown key, naming `where.key` and a suggestion.
    """
    names = {f.name for f in fields(cls)}
    for k in data:
        if k not in names:
            raise ValueError(f"unknown config key {where}{k!r}{_did_you_mean(k, names)}")
    return cls(**{k: v for k, v in data.items()})


SECTIONS = {"model": ModelConfig, "train": TrainConfig, "parallel": ParallelConfig}


def explain_unknown(message: str, sections: dict[str, type] = SECTIONS, options: list[str] | None = None) -> str:
    """Add a 'did you mean' hint to a jsonargparse error about an unknown option or key.

    options: the command's own option names without the leading `--` (its parser's, sections'
    dotted keys included), so a hint names only an option that command takes; default: the
    dotted keys of `sections`."""
    valid = options if options is not None else [f"{s}.{f.name}" for s, cls in sections.items() for f in fields(cls)]
    hints = []
    for bad in re.findall(r"--([A-Za-z_][\w.]*)", message):
        close = difflib.get_close_matches(bad, valid, n=1, cutoff=0.5)
        if close:
            hints.append(f"unknown option --{bad}: did you mean --{close[0]}?")
    m = re.search(r"Option '(\w+)\.(\w+)' is not accepted", message)
    if m and m.group(1) not in sections:
        close = difflib.get_close_matches(m.group(1), list(sections), n=1, cutoff=0.5)
        if close:
            hints.append(f"unknown section {m.group(1)}: did you mean {close[0]}?")
    m = re.search(r"Group '(\w+)' does not accept (?:nested key|option) '(\w+)'", message)
    if m and m.group(1) in sections:
        names = [f.name for f in fields(sections[m.group(1)])]
        close = difflib.get_close_matches(m.group(2), names, n=1, cutoff=0.5)
        if close:
            hints.append(f"unknown key {m.group(1)}.{m.group(2)}: did you mean {m.group(1)}.{close[0]}?")
    return message + ("\n" + "\n".join(hints) if hints else "")


@dataclass
class RunConfig:
    """Everything a `pretrain` run needs; saved as RUN_DIR/config.yaml."""

    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)


def describe_parse_error(message: str, argv: list[str], options: list[str] | None = None) -> str:
    """A parser's error with hints: the nearest valid option or key (among `options`, the
    command's own; see `explain_unknown`), the recipe file it came from, and `--model.preset` for
    `--model NAME`."""
    message = explain_unknown(message, options=options)
    for i, a in enumerate(argv[:-1]):
        if a == "--config" and "<unicode string>" in message:
            message = message.replace("<unicode string>", argv[i + 1])
        elif a == "--config" and argv[i + 1] not in message:
            message += f"\n(recipe: {argv[i + 1]})"
        if a in ("--model", "--train", "--parallel") and not argv[i + 1].endswith((".yaml", ".yml", ".json")):
            message += (f"\n{a} takes a YAML file for that section; for a preset write --model.preset "
                        f"{argv[i + 1]}" if a == "--model" else f"\n{a} takes a YAML file for that section")
    return message


def run_config_from(init) -> RunConfig:
    """RunConfig from a namespace returned by `parse_args` (sections missing there take defaults)."""
    return RunConfig(**{k: getattr(init, k) for k in ("model", "train", "parallel") if hasattr(init, k)})
