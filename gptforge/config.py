"""Typed configuration: plain dataclasses are the single source of truth.

A YAML recipe (`--config recipe.yaml`) and dotted command-line overrides (`--train.lr 3e-4`) fill
them through jsonargparse, so each field's docstring is its `--help` text. Unknown keys are errors
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
from typing import Any, Literal, Optional

# ---------------------------------------------------------------------------------------------
# Model


@dataclass
class ModelConfig:
    """Shape of the decoder. None means: from `preset`, else the documented default."""

    preset: Optional[str] = None
    """Named shape (gpt2-nano, gpt2-micro, gpt2-mini, gpt2-small, gpt2-medium, gpt2-large, gpt2-xl,
    llama-nano, llama-micro, llama-60m, llama-160m, llama-2-7b, llama-2-13b, llama-2-70b,
    llama-3-8b, llama-3-70b). Other model.* keys override it."""
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
    activation: Optional[Literal["gelu", "gelu_tanh"]] = None
    """GPT-2 MLP nonlinearity: gelu (exact, erf; as nanoGPT) or gelu_tanh (the tanh approximation
    of the original GPT-2 and Hugging Face's "gelu_new"). Llama blocks always use SwiGLU.
    Default gelu (about twice as fast as gelu_tanh on CPUs)."""
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
            if arch == "gpt2":
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
    lr: float = 6e-4
    """Peak learning rate."""
    min_lr: float = 6e-5
    """Learning rate at the end of decay."""
    warmup_steps: int = 100
    """Linear warmup steps from 0 to lr."""
    lr_schedule: Literal["cosine", "linear", "constant", "wsd"] = "cosine"
    """After warmup: cosine or linear decay to min_lr, constant, or warmup-stable-decay."""
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
    optimizer: Literal["adamw", "sgd", "adamw8bit", "adafactor"] = "adamw"
    """Optimizer. adamw (fused where the device supports it) and sgd run everywhere; adamw8bit and
    adafactor are planner-only here."""
    precision: Literal["fp32", "bf16", "fp16", "fp8"] = "fp32"
    """Autocast precision: fp32, bf16 or fp16 (with a gradient scaler). fp8 is planner-only."""
    eval_interval: int = 100
    """Evaluate on the val split every N steps (and at the last step); 0 disables."""
    eval_steps: int = 20
    """Number of fixed val batches per evaluation."""
    patience: int = 0
    """Early stopping: stop after this many evaluations without improvement; 0 disables."""
    checkpoint_interval: int = 500
    """Write a checkpoint every N steps (and at the end); 0 writes only at the end."""
    keep_checkpoints: int = 2
    """Number of recent step checkpoints kept (the best one is always kept)."""
    stop_at_step: int = 0
    """End the run at this step as if interrupted (checkpoint written); 0 disables."""
    max_bad_steps: int = 5
    """Stop after this many consecutive optimizer steps with a non-finite loss or gradient."""
    seed: int = 1337
    """Seed for initialisation, data sampling and dropout."""
    device: str = "auto"
    """auto (CUDA, then MPS, then CPU), cpu, cuda, cuda:N or mps."""
    activation_checkpointing: Literal["none", "selective", "full"] = "none"
    """Recompute activations in backward: none, selective (attention and MLP inner activations
    of every other block) or full (every block)."""
    compile: bool = False
    """Wrap the model in torch.compile."""
    log_interval: int = 1
    """Write metrics every N steps."""
    num_threads: int = 0
    """CPU threads for torch (0: leave torch's default)."""
    tensorboard: bool = True
    """Write TensorBoard event files to RUN_DIR/tb."""

    @property
    def tokens_per_step_factor(self) -> int:
        return self.micro_batch_size * self.gradient_accumulation_steps


@dataclass
class ParallelConfig:
    """How the job is laid out over devices (see docs/distributed.md).

    The product dp_replicate * dp_shard * tp * pp must equal the number of processes torchrun
    starts. ZeRO stages map to PyTorch mechanisms: 1 = DDP + ZeroRedundancyOptimizer, 2 = FSDP2
    with reshard_after_forward=False, 3 = FSDP2 full sharding (the default when dp_shard > 1).
    """

    dp_replicate: int = 1
    """Data-parallel replicas (DDP, or HSDP's replicate dimension)."""
    dp_shard: int = 1
    """Data-parallel shards (FSDP2 / ZeRO)."""
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

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp


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


def explain_unknown(message: str, sections: dict[str, type] = SECTIONS) -> str:
    """Add a 'did you mean' hint to a jsonargparse error about an unknown option or key."""
    valid = [f"{s}.{f.name}" for s, cls in sections.items() for f in fields(cls)]
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


def make_parser(prog: str, description: str, sections: dict[str, type] = SECTIONS):
    """A jsonargparse parser with `--config recipe.yaml` and one `--section.key` option per field.

    Field docstrings become the `--help` text. Later options override earlier ones, and options
    override the recipe, so `--config r.yaml --train.lr 1e-3` takes lr from the command line.
    """
    import jsonargparse

    jsonargparse.set_parsing_settings(docstring_parse_attribute_docstrings=True)
    parser = jsonargparse.ArgumentParser(prog=prog, description=description, exit_on_error=False)
    parser.add_argument("--config", action=jsonargparse.ActionConfigFile,
                        help="YAML recipe with model:, train: and parallel: sections (any subset of keys).")
    for name, cls in sections.items():
        parser.add_class_arguments(cls, name, help=(cls.__doc__ or "").strip().splitlines()[0])
    return parser


def parse_args(parser, argv: list[str]):
    """Parse `argv`; on a bad option or key print the error with a 'did you mean' hint and exit 2.

    Returns: (namespace with dataclass instances per section, plain namespace).
    """
    import sys

    try:
        ns = parser.parse_args(argv)
    except SystemExit:
        raise
    except Exception as e:  # jsonargparse.ArgumentError and friends
        message = explain_unknown(str(e))
        for i, a in enumerate(argv[:-1]):
            if a == "--config" and "<unicode string>" in message:
                message = message.replace("<unicode string>", argv[i + 1])
            elif a == "--config" and argv[i + 1] not in message:
                message += f"\n(recipe: {argv[i + 1]})"
            if a in ("--model", "--train", "--parallel") and not argv[i + 1].endswith((".yaml", ".yml", ".json")):
                message += (f"\n{a} takes a YAML file for that section; for a preset write --model.preset "
                            f"{argv[i + 1]}" if a == "--model" else f"\n{a} takes a YAML file for that section")
        print(f"{parser.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2) from None
    return parser.instantiate(ns), ns


def run_config_from(init) -> RunConfig:
    """RunConfig from a namespace returned by `parse_args` (sections missing there take defaults)."""
    return RunConfig(**{k: getattr(init, k) for k in ("model", "train", "parallel") if hasattr(init, k)})
