"""The GPT decoder: GPT-2 blocks and Llama blocks as options of one module.

Reads top to bottom like the papers:
- GPT-2 (Radford et al. 2019): learned absolute positions, pre-LayerNorm, GELU MLP, tied
  embeddings, init N(0, 0.02) with residual projections scaled by 1/sqrt(2*n_layer).
- Llama (Touvron et al. 2023): rotary position embedding (Su et al. 2021), RMSNorm
  (Zhang & Sennrich 2019), SwiGLU MLP (Shazeer 2020), grouped-query attention (Ainslie et al. 2023).

Options from the speedrun literature (each off by default; see `ModelConfig` for sources):
QK-norm, squared-ReLU MLP, zero-initialised output projections, a logit soft cap and value
embeddings.

The module knows nothing of parallelism, data or losses: it maps token ids (B, T) to logits
(B, T, vocab_size). DDP/FSDP2/TP, activation checkpointing and compile are applied from outside.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptforge.config import ModelConfig


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dim: x / sqrt(mean(x^2) + eps) * weight (no bias)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # The same arithmetic in one fused op: fewer kernels per call (matters when decoding).
            return F.rms_norm(x, (x.size(-1),), self.weight, self.eps)
        # Normalise in fp32 for stability under autocast, then cast back.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


def rope_tables(
    head_dim: int, max_len: int, theta: float, device=None, scaling: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables for rotary embeddings, each (max_len, head_dim/2), fp32.

    Frequencies theta^(-2i/head_dim), i = 0..head_dim/2-1 (Su et al. 2021, eq. 15), optionally
    rescaled by `scaling` (see `scale_rope_frequencies`).
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    if scaling:
        inv_freq = scale_rope_frequencies(inv_freq, scaling)
    t = torch.arange(max_len, dtype=torch.float32, device=device)
    freqs = torch.outer(t, inv_freq)
    return freqs.cos(), freqs.sin()


def scale_rope_frequencies(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Rescale RoPE inverse frequencies (head_dim/2,) for a longer context; returns the same shape.

    - "linear": every frequency divided by `factor` (position interpolation, Chen et al. 2023).
    - "llama3": wavelengths longer than original_max_position_embeddings / low_freq_factor are
      divided by `factor`, those shorter than original / high_freq_factor are kept, and the band
      between is interpolated linearly in original/wavelength (Llama 3.1, Meta's reference code
      `apply_scaling`; Dubey et al. 2024, section 3.3.4 / Hugging Face rope_type "llama3").

    Raises:
        ValueError: another rope_type (naming it), or a missing key.
    """
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq
    try:
        factor = float(scaling["factor"])
        if kind == "linear":
            return inv_freq / factor
        if kind == "llama3":
            low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
            original = float(scaling["original_max_position_embeddings"])
    except KeyError as e:
        raise ValueError(f"model.rope_scaling: rope_type {kind!r} needs the key {e.args[0]!r}") from None
    if kind != "llama3":
        raise ValueError(
            f"model.rope_scaling.rope_type {kind!r} is not supported; use 'linear' or 'llama3' (or none)"
        )
    wavelen = 2 * math.pi / inv_freq
    smooth = ((original / wavelen - low) / (high - low)).clamp(0.0, 1.0)
    # smooth = 0 for long wavelengths (fully interpolated), 1 for short ones (kept as is).
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (first half, second half) of the head dim, the Hugging Face Llama layout.

    x: (B, H, T, hd); cos, sin: (B or 1, 1, T, hd/2). Returns x's shape and dtype.
    """
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.type_as(x)


def document_mask(idx: torch.Tensor, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions and attention mask that keep attention inside each document of packed sequences.

    An EOS token opens the document that follows it, as the empty prompt `[eos]` of generation
    does: the window `a b EOS c d EOS e` holds the documents `a b`, `EOS c d` and `EOS e`. So every
    target, the EOS that ends a document included, is predicted from its own document only, and a
    masked document gives the logits of that document run alone (Llama 3 trains with such a
    block-diagonal causal mask, Dubey et al. 2024, sec. 3.2).

    idx: (B, T) int64 token ids. Returns (position_ids (B, T) int64, restarting at 0 at each EOS;
    attn_mask (B, 1, T, T) bool, True where query i may attend key j: j <= i in the same document).
    Pass both to `GPT.forward`; positions restart for learned positions (gpt2) and RoPE alike.
    """
    B, T = idx.shape
    is_eos = idx == eos_id
    doc = is_eos.cumsum(dim=1)  # document index of each position
    t = torch.arange(T, device=idx.device).expand(B, T)
    start = torch.where(is_eos, t, torch.zeros_like(t)).cummax(dim=1).values  # first position of the document
    same_doc = doc[:, :, None] == doc[:, None, :]
    causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
    return t - start, (same_doc & causal)[:, None]


class KVCache:
    """Pre-allocated key/value cache for one attention layer.

    k, v: (B, n_kv_head, max_len, head_dim). `pos` is the number of filled positions.
    """

    def __init__(self, batch: int, n_kv_head: int, max_len: int, head_dim: int, device, dtype):
        self.k = torch.zeros(batch, n_kv_head, max_len, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.pos = 0

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k, v (B, n_kv_head, T, hd); return all cached keys/values so far."""
        t = k.size(2)
        if self.pos + t > self.k.size(2):
            raise ValueError(f"KV cache overflow: {self.pos}+{t} positions > max_len {self.k.size(2)}")
        self.k[:, :, self.pos : self.pos + t] = k
        self.v[:, :, self.pos : self.pos + t] = v
        self.pos += t
        return self.k[:, :, : self.pos], self.v[:, :, : self.pos]


class Attention(nn.Module):
    """Multi-head causal self-attention with optional grouped-query KV heads and RoPE."""

    def __init__(self, cfg: ModelConfig, value_embedding: bool = False):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_head * cfg.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_head * cfg.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_head * cfg.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.n_head * cfg.head_dim, cfg.d_model, bias=cfg.bias)
        self.o_proj.is_residual_proj = True  # type: ignore[assignment]  # a plain flag _init_weights reads
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.use_rope = cfg.arch == "llama"
        self.eager = cfg.attention == "eager"
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
        if value_embedding:
            self.v_embed = nn.Embedding(cfg.vocab_size, cfg.n_kv_head * cfg.head_dim)

    def fuses_qkv(self) -> bool:
        """Whether `project_qkv` runs one matmul for q, k and v: with gradients on (training), when
        q_proj, k_proj and v_proj are plain nn.Linear layers holding plain parameters, without hooks.
        LoRA and quantized layers (other classes), tensor-parallel or FSDP2 DTensor parameters and
        pruning's reparametrized weights keep the three matmuls; so does inference (no gradients),
        where concatenating the weights on every decoded token would copy them once more per token.
        """
        if not torch.is_grad_enabled():
            return False
        for m in (self.q_proj, self.k_proj, self.v_proj):
            if type(m) is not nn.Linear or m._forward_hooks or m._forward_pre_hooks:
                return False
            if type(m.weight) is not nn.Parameter or (m.bias is not None and type(m.bias) is not nn.Parameter):
                return False
        return True

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, C) -> q (B, T, n_head * hd), k and v (B, T, n_kv_head * hd) each.

        When `fuses_qkv`, one F.linear over the three weights (and biases) concatenated at call time:
        one (C, (n_head + 2 n_kv_head) hd) matmul instead of three narrower ones, the parameters,
        their names, the tensor-parallel plan, LoRA targets and checkpoints unchanged. The
        concatenation costs one copy of the weights per forward (their gradients are split back in
        backward), small beside a training batch's matmul (step times in bench/RESULTS.md, issue 29).
        """
        if not self.fuses_qkv():
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        bias = None
        if self.q_proj.bias is not None:
            bias = torch.cat((self.q_proj.bias, self.k_proj.bias, self.v_proj.bias))
        weight = torch.cat((self.q_proj.weight, self.k_proj.weight, self.v_proj.weight))
        qkv = F.linear(x, weight, bias)
        q_width, kv_width = self.q_proj.weight.shape[0], self.k_proj.weight.shape[0]
        q, k, v = qkv.split((q_width, kv_width, kv_width), dim=-1)
        return q, k, v

    def forward(self, x, rope=None, cache: KVCache | None = None, attn_mask=None, *, idx=None):
        """x: (B, T, C) -> (B, T, C).

        rope: (cos, sin) each (B or 1, 1, T, hd/2) for these positions. attn_mask: optional bool
        (B or 1, 1, T, S), True = may attend; when None, causal masking is used. idx: the token
        ids (B, T), needed by a layer with a value embedding.

        Raises:
            ValueError: a value-embedding layer called without token ids (e.g. a pipeline stage).
        """
        B, T, _ = x.shape
        q, k, v = self.project_qkv(x)
        # Heads may be sharded by tensor parallelism: infer the local count from the output width.
        q = q.view(B, T, -1, self.head_dim).transpose(1, 2)
        k = k.view(B, T, -1, self.head_dim).transpose(1, 2)
        if hasattr(self, "v_embed"):
            if idx is None:
                raise ValueError("model.value_embeddings needs the token ids in every block; this caller "
                                 "(e.g. pipeline parallelism) does not pass them: turn value_embeddings off")
            v = v + self.v_embed(idx).to(v.dtype)
        v = v.view(B, T, -1, self.head_dim).transpose(1, 2)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        if self.use_rope:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        past = 0
        if cache is not None:
            past = cache.pos
            k, v = cache.update(k, v)
        S = k.size(2)
        if attn_mask is None and past > 0 and T > 1:
            # Chunk after a prefix: query i (absolute past+i) sees keys 0..past+i.
            attn_mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(diagonal=past)[None, None]
        is_causal = attn_mask is None and T > 1 and past == 0
        groups = q.size(1) // k.size(1)
        # Without gradients (decoding) attention shares the KV heads itself (enable_gqa): no copy of
        # the cache per step (4x faster attention on a CPU at one query, measured; the same values).
        gqa = groups > 1 and not self.eager and not torch.is_grad_enabled()
        if groups > 1 and not gqa:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        p = self.dropout if self.training else 0.0
        if self.eager:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            if is_causal:
                attn_mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril()[None, None]
            att = att.float()
            if attn_mask is not None:
                # The lowest finite value, not -inf: a fully masked (padding) row would be
                # softmax(all -inf) = NaN, and NaN reaches the real tokens through the next
                # layer's keys and through the backward pass. Such a row attends to nothing
                # (zeros), as scaled_dot_product_attention returns.
                att = att.masked_fill(~attn_mask, torch.finfo(att.dtype).min).softmax(-1)
                att = att.masked_fill(~attn_mask.any(-1, keepdim=True), 0.0)
            else:
                att = att.softmax(-1)
            att = F.dropout(att.type_as(q), p=p, training=self.training)
            y = att @ v
        elif q.device.type == "cpu" and q.dtype == torch.bfloat16 and torch.is_grad_enabled():
            # On CPUs, torch's bf16 flash-attention backward is slower than its fp32 one (measured
            # 1.6x on an AVX-512 Xeon, torch 2.13): when training under bf16 autocast, attend in
            # fp32. CPU autocast lists scaled_dot_product_attention as a bf16 op and would cast the
            # fp32 copies straight back (eager and compiled alike): the call leaves autocast.
            # Without gradients (decoding) bf16 attends as it is: no upcast copy of the cache.
            with torch.autocast("cpu", enabled=False):
                y = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=attn_mask,
                                                   dropout_p=p, is_causal=is_causal)
            y = y.to(q.dtype)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p, is_causal=is_causal,
                                               enable_gqa=gqa)
        y = y.transpose(1, 2).reshape(B, T, -1)
        return self.resid_dropout(self.o_proj(y))


class MLP(nn.Module):
    """GPT-2: down(gelu(up(x))). Llama: down(silu(gate(x)) * up(x)) (SwiGLU). activation relu2
    (either family): down(relu(up(x))^2). (B, T, C) -> (B, T, C)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.relu2 = cfg.activation == "relu2"
        self.swiglu = cfg.arch == "llama" and not self.relu2
        self.gelu_approximate = "tanh" if cfg.activation == "gelu_tanh" else "none"
        if self.swiglu:
            self.gate_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.down_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.down_proj.is_residual_proj = True  # type: ignore[assignment]  # a plain flag _init_weights reads
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        if self.swiglu:
            h = F.silu(self.gate_proj(x)) * self.up_proj(x)
        elif self.relu2:
            h = F.relu(self.up_proj(x)).square()
        else:
            h = F.gelu(self.up_proj(x), approximate=self.gelu_approximate)
        return self.dropout(self.down_proj(h))


def _norm(cfg: ModelConfig) -> RMSNorm | nn.LayerNorm:
    if cfg.arch == "llama":
        return RMSNorm(cfg.d_model, cfg.norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm_1(x)); x + mlp(norm_2(x))."""

    def __init__(self, cfg: ModelConfig, value_embedding: bool = False):
        super().__init__()
        self.norm_1 = _norm(cfg)
        self.attn = Attention(cfg, value_embedding)
        self.norm_2 = _norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x, rope=None, cache=None, attn_mask=None, *, idx=None):
        # idx (token ids, for a value embedding) travels as a keyword only when given, so that
        # tensor parallelism's per-argument input layouts (4 positional inputs) still apply.
        extra = {"idx": idx} if idx is not None else {}
        x = x + self.attn(self.norm_1(x), rope, cache, attn_mask, **extra)
        return x + self.mlp(self.norm_2(x))


class GPT(nn.Module):
    """Decoder-only transformer. `GPT(cfg)` with `cfg = ModelConfig(...).resolved()`.

    forward(idx (B, T) int64) -> logits (B, T, vocab_size), in the autocast dtype or fp32.

    Raises:
        ValueError: a sequence longer than block_size for learned positions.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.n_layer is None:
            cfg = cfg.resolved()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.arch == "gpt2":
            self.wpe = nn.Embedding(cfg.block_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg, has_value_embedding(cfg, i)) for i in range(cfg.n_layer)])
        self.norm_f = _norm(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        if cfg.arch == "llama":
            cos, sin = rope_tables(cfg.head_dim, cfg.block_size, cfg.rope_theta, scaling=cfg.rope_scaling)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        # GPT-2 init: N(0, 0.02); residual output projections N(0, 0.02/sqrt(2*n_layer)).
        if isinstance(module, nn.Linear):
            std = 0.02
            if getattr(module, "is_residual_proj", False):
                std = 0.02 / math.sqrt(2 * self.config.n_layer)
            if getattr(module, "is_residual_proj", False) and self.config.zero_init_proj:
                std = 0.0
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def reset_rope(self) -> None:
        """Recompute the RoPE tables (after moving off the meta device)."""
        if self.config.arch == "llama":
            cos, sin = rope_tables(self.config.head_dim, self.config.block_size, self.config.rope_theta,
                                   device=self.norm_f.weight.device, scaling=self.config.rope_scaling)
            self.rope_cos, self.rope_sin = cos, sin

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count; shared (tied) tensors counted once, weights stored packed (modules with
        a `quantized_numel`) included. non_embedding drops wte/wpe."""
        seen, n = set(), 0
        for name, p in self.named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            if non_embedding and name.split(".")[0] in ("wte", "wpe"):
                continue
            n += p.numel()
        # Weights kept in a packed form as buffers (4-bit QLoRA layers) still count as parameters.
        n += sum(int(getattr(m, "quantized_numel", 0)) for m in self.modules())
        return n

    def forward(
        self,
        idx: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        caches: list[KVCache] | None = None,
        last_only: bool = False,
        select: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """idx (B, T) -> logits (B, T, V), or (B, 1, V) with last_only, or (N, V) with select.

        select: (rows, cols), each (N,) int64: logits only at positions idx[rows, cols] (the final
        norm and the vocabulary projection run on those N positions only, e.g. for scoring).

        position_ids: (B, T) or (T,) absolute positions (default: past + arange(T)), e.g. restarting
        per packed sequence. attn_mask: bool (B or 1, 1, T, S), True = may attend (default causal).
        caches: one KVCache per block for incremental decoding.
        """
        B, T = idx.shape
        past = caches[0].pos if caches else 0
        if position_ids is None:
            if past + T > self.config.block_size:
                raise ValueError(
                    f"sequence of {past + T} positions exceeds model.block_size {self.config.block_size}"
                )
            # Consecutive positions: the tables are sliced (views), not gathered by an index tensor.
            positions: torch.Tensor | slice = slice(past, past + T)
        else:
            positions = position_ids.unsqueeze(0) if position_ids.dim() == 1 else position_ids
        x = self.embed(idx, positions)
        rope = self.rope_at(positions)
        for i, block in enumerate(self.blocks):
            extra = {"idx": idx} if hasattr(block.attn, "v_embed") else {}
            x = block(x, rope, caches[i] if caches else None, attn_mask, **extra)
        if last_only:
            x = x[:, -1:, :]
        elif select is not None:
            x = x[select[0], select[1]]
        return self.head(x)

    # The three pieces of forward, also called by pipeline stages (gptforge.train.parallel.parallelize),
    # which hold these submodules under the same names.

    def embed(self, idx: torch.Tensor, position_ids: torch.Tensor | slice) -> torch.Tensor:
        """Token (+ learned position, gpt2) embeddings with dropout: idx (B, T) -> (B, T, C).
        position_ids: (B or 1, T) int64, or a slice of T consecutive positions."""
        x = self.wte(idx)
        if self.config.arch == "gpt2":
            x = x + (self.wpe.weight[position_ids] if isinstance(position_ids, slice) else self.wpe(position_ids))
        return self.drop(x)

    def rope_at(self, position_ids: torch.Tensor | slice):
        """RoPE (cos, sin) for positions (B or 1, T) (or a slice of T consecutive positions), each
        (B or 1, 1, T, hd/2); None for gpt2."""
        if self.config.arch == "gpt2":
            return None
        if isinstance(position_ids, slice):
            return self.rope_cos[position_ids][None, None], self.rope_sin[position_ids][None, None]
        return self.rope_cos[position_ids][:, None], self.rope_sin[position_ids][:, None]

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm and output projection: (B, T, C) -> logits (B, T, V); with
        model.logit_softcap c, c * tanh(logits / c) (computed in fp32, returned in the logits'
        dtype)."""
        logits = self.lm_head(self.norm_f(x))
        c = self.config.logit_softcap
        if c:
            logits = (c * torch.tanh(logits.float() / c)).to(logits.dtype)
        return logits

    def make_caches(self, batch: int, max_len: int | None = None, dtype=None) -> list[KVCache]:
        """One empty KVCache per block, sized for `max_len` positions (default block_size)."""
        cfg = self.config
        p = self.norm_f.weight  # not wte's: a quantized embedding stores int8
        return [
            KVCache(batch, cfg.n_kv_head, max_len or cfg.block_size, cfg.head_dim, p.device, dtype or p.dtype)
            for _ in range(cfg.n_layer)
        ]


def has_value_embedding(cfg: ModelConfig, layer: int) -> bool:
    """Whether block `layer` (0-based) has a value embedding: with model.value_embeddings, every
    other block counting back from the last (the last, the third from last, ...)."""
    return bool(cfg.value_embeddings) and (cfg.n_layer - 1 - layer) % 2 == 0
