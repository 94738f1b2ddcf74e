"""The model section (`model.*`): the decoder's shape, filled from a preset by `ModelConfig.resolved()`."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Literal, Optional

from gptforge.config.dicts import _did_you_mean
from gptforge.errors import OptionError
from gptforge.ranges import bounded, out_of_range


def check_preset(name: str, option: str = "model.preset") -> None:
    """Refuse a preset name that gptforge.presets.PRESETS lacks.

    option: how the message names the setting (a command's own option: `--preset`).

    Raises:
        OptionError (a ValueError): "OPTION: unknown preset 'X' (did you mean 'Y'?); choose one of ..." (every name).
    """
    from gptforge.presets import PRESETS

    if name not in PRESETS:
        raise OptionError(f"{option}: unknown preset {name!r}{_did_you_mean(name, PRESETS)}; "
                         f"choose one of {', '.join(PRESETS)}")


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
    n_layer: Optional[int] = bounded(None, low=1)
    """Number of transformer blocks. Default 4."""
    n_head: Optional[int] = bounded(None, low=1)
    """Number of query heads. Default 4."""
    n_kv_head: Optional[int] = bounded(None, low=1)
    """Number of key/value heads (grouped-query attention); must divide n_head. Default n_head."""
    d_model: Optional[int] = bounded(None, low=1)
    """Hidden size (embedding width). Default 128."""
    d_ff: Optional[int] = bounded(None, low=1)
    """MLP inner width. Default 4*d_model for gpt2; for llama 8/3*d_model rounded up to a multiple
    of 16."""
    block_size: Optional[int] = bounded(None, low=1)
    """Context length in tokens (seq_len). Default 256."""
    vocab_size: Optional[int] = bounded(None, low=1)
    """Vocabulary size. With --data, taken from the data's tokenizer unless set."""
    dropout: Optional[float] = bounded(None, low=0, high=1, high_open=True)
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
    logit_softcap: Optional[float] = bounded(None, low=0)
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
    head_size: Optional[int] = bounded(None, low=1)
    """Width of one attention head. Default d_model / n_head; `gptforge prune` sets it when it
    prunes heads and embedding channels separately (attention width n_head * head_size then
    differs from d_model)."""

    def resolved(self) -> "ModelConfig":
        """Return a copy with every field filled: preset values, then explicit fields, then defaults.

        Raises:
            OptionError (a ValueError): unknown preset (with the nearest name), a value out of its
                range (`bounded`), or inconsistent shapes
                (d_model not divisible by n_head, n_head not divisible by n_kv_head).
        """
        from gptforge.presets import PRESETS

        values: dict[str, Any] = {}
        if self.preset is not None:
            check_preset(self.preset)
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
        bad = out_of_range(out)  # each single-field range: its `bounded` declaration
        if bad is not None:
            raise OptionError(f"model.{bad[0]} must be {bad[2]}, got {bad[1]}")
        if out.head_size is None and out.d_model % out.n_head:
            raise OptionError(f"model.d_model ({out.d_model}) must be divisible by model.n_head ({out.n_head})")
        if out.n_head % out.n_kv_head:
            raise OptionError(f"model.n_head ({out.n_head}) must be divisible by model.n_kv_head ({out.n_kv_head})")
        if out.arch == "llama" and out.head_dim % 2:
            raise OptionError("llama (RoPE) needs an even head dimension (d_model/n_head or head_size)")
        return out

    @property
    def head_dim(self) -> int:
        """Width of one attention head: head_size, else d_model // n_head."""
        return self.head_size or self.d_model // self.n_head
