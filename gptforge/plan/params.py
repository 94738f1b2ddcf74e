"""Parameter shapes and counts of `gptforge.model.gpt.GPT`, in closed form (no tensors built).

The planner needs the shapes, not just the count: Adafactor's state depends on the matrix shapes,
tensor parallelism splits matrices but not norms, and pipeline stages split blocks. The shapes
below mirror `GPT.__init__` one for one; tests check them against `GPT(cfg).named_parameters()`
on the meta device for every preset, so the two cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gptforge.config import ModelConfig


@dataclass(frozen=True)
class ParamShape:
    """One parameter tensor: dotted name as in `GPT.named_parameters()`, shape, and its role."""

    name: str
    shape: tuple[int, ...]
    role: str
    """'embedding' (wte, wpe), 'head' (untied lm_head), 'block' (inside a transformer block), 'final_norm'."""

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def is_matrix(self) -> bool:
        return len(self.shape) >= 2


def block_param_shapes(cfg: ModelConfig, prefix: str = "", value_embedding: bool = False) -> list[ParamShape]:
    """Parameters of one transformer block (`Block` in gpt.py); value_embedding: the block has a
    value-embedding table (`has_value_embedding`). cfg must be resolved."""
    h, hd, f = cfg.d_model, cfg.head_dim, cfg.d_ff
    q_out, kv_out = cfg.n_head * hd, cfg.n_kv_head * hd
    out: list[ParamShape] = []

    def lin(name, n_in, n_out, bias):
        out.append(ParamShape(f"{prefix}{name}.weight", (n_out, n_in), "block"))
        if bias:
            out.append(ParamShape(f"{prefix}{name}.bias", (n_out,), "block"))

    def norm(name):
        out.append(ParamShape(f"{prefix}{name}.weight", (h,), "block"))
        if cfg.arch == "gpt2" and cfg.bias:
            out.append(ParamShape(f"{prefix}{name}.bias", (h,), "block"))

    norm("norm_1")
    lin("attn.q_proj", h, q_out, cfg.qkv_bias)
    lin("attn.k_proj", h, kv_out, cfg.qkv_bias)
    lin("attn.v_proj", h, kv_out, cfg.qkv_bias)
    lin("attn.o_proj", q_out, h, cfg.bias)
    if cfg.qk_norm:
        out.append(ParamShape(f"{prefix}attn.q_norm.weight", (hd,), "block"))
        out.append(ParamShape(f"{prefix}attn.k_norm.weight", (hd,), "block"))
    if value_embedding:
        out.append(ParamShape(f"{prefix}attn.v_embed.weight", (cfg.vocab_size, kv_out), "block"))
    norm("norm_2")
    if cfg.arch == "llama" and cfg.activation != "relu2":
        lin("mlp.gate_proj", h, f, cfg.bias)
    lin("mlp.up_proj", h, f, cfg.bias)
    lin("mlp.down_proj", f, h, cfg.bias)
    return out


def param_shapes(cfg: ModelConfig) -> list[ParamShape]:
    """Every parameter of `GPT(cfg)`, tied embeddings listed once. cfg must be resolved."""
    if cfg.n_layer is None:
        cfg = cfg.resolved()
    h = cfg.d_model
    out = [ParamShape("wte.weight", (cfg.vocab_size, h), "embedding")]
    if cfg.arch == "gpt2":
        out.append(ParamShape("wpe.weight", (cfg.block_size, h), "embedding"))
    for i in range(cfg.n_layer):
        out += block_param_shapes(cfg, prefix=f"blocks.{i}.", value_embedding=_has_ve(cfg, i))
    out.append(ParamShape("norm_f.weight", (h,), "final_norm"))
    if cfg.arch == "gpt2" and cfg.bias:
        out.append(ParamShape("norm_f.bias", (h,), "final_norm"))
    if not cfg.tie_embeddings:
        out.append(ParamShape("lm_head.weight", (cfg.vocab_size, h), "head"))
    return out


def param_count(cfg: ModelConfig) -> int:
    """Number of parameters N of `GPT(cfg)` (tied embeddings counted once), as `GPT.num_params()`."""
    if cfg.n_layer is None:
        cfg = cfg.resolved()
    per_block = sum(p.numel for p in block_param_shapes(cfg))
    rest = sum(p.numel for p in param_shapes(replace(cfg, n_layer=0)))
    n_ve = sum(_has_ve(cfg, i) for i in range(cfg.n_layer))
    return per_block * cfg.n_layer + rest + n_ve * cfg.vocab_size * cfg.n_kv_head * cfg.head_dim


def _has_ve(cfg: ModelConfig, layer: int) -> bool:
    # Mirrors gptforge.model.gpt.has_value_embedding (plan may import model, kept closed-form here).
    return bool(cfg.value_embeddings) and (cfg.n_layer - 1 - layer) % 2 == 0


def block_param_count(cfg: ModelConfig) -> int:
    """Parameters in one transformer block."""
    return sum(p.numel for p in block_param_shapes(cfg))
