"""Activation memory of one transformer block, in bytes: Korthikanti et al. 2022's table 2 verbatim
and gptforge's own block counted tensor by tensor as autograd saves it (see
`gptforge.plan.memory`'s module docstring for what is counted and why)."""

from __future__ import annotations

from dataclasses import dataclass

from gptforge.config import ModelConfig


def act_bytes(precision: str) -> int:
    """Bytes per element of activations saved in the compute dtype (fp32: 4; bf16/fp16/fp8: 2)."""
    return 4 if precision == "fp32" else 2


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


def recompute_split(n_layer: int, mode: str) -> tuple[int, int]:
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


