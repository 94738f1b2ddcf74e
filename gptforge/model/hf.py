"""Hugging Face checkpoints <-> the gptforge GPT module: configs, tensor names, reading weights.

Supported `model_type`s (the `config.json` field):

| model_type | gptforge arch | notes                                                            |
|------------|---------------|------------------------------------------------------------------|
| gpt2       | gpt2          | Conv1D weights (in, out) are transposed; fused c_attn is split   |
| llama      | llama         | Llama 2/3/3.1: GQA, tied or untied, rope_scaling linear/llama3   |
| mistral    | llama         | sliding_window must be null or >= the context used (block_size)  |
| qwen2      | llama         | q/k/v biases (qkv_bias=True), no o_proj/MLP biases               |

A Llama-family `head_dim` other than hidden_size / num_attention_heads becomes `head_size`.
Anything that changes the maths and has no gptforge counterpart (another activation, yarn/dynamic RoPE, alternating sliding-window layers, cross
attention, ...) raises `UnsupportedHFConfig` naming the config field, rather than converting
to a model that silently computes something else.

This module reads Hugging Face folders with safetensors/torch alone: transformers is not needed
to convert, only to test that the results load (the optional `hf` extra).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from gptforge.config import ModelConfig
from gptforge.errors import InputError
from gptforge.model.gpt import GPT

SUPPORTED_MODEL_TYPES = ("gpt2", "llama", "mistral", "qwen2", "qwen3")

# Activations whose Hugging Face name means GELU with the tanh approximation, the one GPT-2 uses.
_GPT2_TANH_GELU = ("gelu_new", "gelu_pytorch_tanh")


class UnsupportedHFConfig(InputError):
    """A Hugging Face config that gptforge cannot represent exactly; the message names the field."""


# ---------------------------------------------------------------------------------------------
# Configs


def _unsupported(where: str, field: str, value: Any, why: str) -> UnsupportedHFConfig:
    return UnsupportedHFConfig(f"{where}: unsupported {field}={value!r}: {why}")


def _rope_from_hf(hf: dict, where: str) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from legacy (`rope_theta`, `rope_scaling`) or transformers v5
    (`rope_parameters`) keys."""
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and "rope_type" not in params and params and all(
        isinstance(v, dict) for v in params.values()
    ):
        raise _unsupported(where, "rope_parameters", params, "per-layer-type RoPE parameters")
    theta = hf.get("rope_theta")
    scaling = hf.get("rope_scaling")
    if isinstance(params, dict):
        theta = params.get("rope_theta", theta)
        scaling = scaling or params
    theta = 10000.0 if theta is None else float(theta)
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        field = "rope_scaling.rope_type"
        if kind != "default" and scaling.get("attention_factor") not in (None, 1, 1.0):
            raise _unsupported(where, "rope_scaling.attention_factor", scaling["attention_factor"], "only 1 is supported")
        if kind == "default":
            scaling = None
        elif kind == "linear":
            scaling = {"rope_type": "linear", "factor": float(scaling["factor"])}
        elif kind == "llama3":
            keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
            missing = [k for k in keys if k not in scaling]
            if missing:
                raise _unsupported(where, "rope_scaling", scaling, f"llama3 scaling lacks {missing}")
            scaling = {"rope_type": "llama3", **{k: scaling[k] for k in keys}}
        else:
            raise _unsupported(where, field, kind, "gptforge implements RoPE scaling 'linear' and 'llama3'")
    partial = (params or {}).get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise _unsupported(where, "partial_rotary_factor", partial, "RoPE on part of the head is not supported")
    return theta, scaling


def config_from_hf(hf: dict, where: str = "config.json", block_size: int | None = None) -> ModelConfig:
    """Map a Hugging Face `config.json` dict to a resolved `ModelConfig`.

    block_size: context length to build (default the config's `n_positions` /
    `max_position_embeddings`; a smaller value saves RoPE table memory). Dropout is set to 0: Hugging
    Face's `*_pdrop` fields are training settings, and pretrained models are usually fine-tuned
    without dropout; set `model.dropout` to change it.

    Raises:
        UnsupportedHFConfig: a model_type or a field value gptforge cannot represent exactly; the
            message names `where` and the field.
    """
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise _unsupported(
            where, "model_type", model_type, f"gptforge converts {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    if model_type == "gpt2":
        return _gpt2_config(hf, where, block_size).resolved()
    return _llama_config(hf, where, model_type, block_size).resolved()


def _gpt2_config(hf: dict, where: str, block_size: int | None) -> ModelConfig:
    """GPT-2: learned positions, LayerNorm, a GELU (or relu2) MLP, biases everywhere."""
    act = hf.get("activation_function", "gelu_new")
    if act not in _GPT2_TANH_GELU + ("gelu", "relu2"):
        raise _unsupported(where, "activation_function", act,
                           "gptforge's GPT-2 MLP uses GELU, exact (gelu) or tanh (gelu_new), or relu2")
    for field, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                      ("add_cross_attention", False)):
        if hf.get(field, ok) != ok:
            raise _unsupported(where, field, hf[field], f"only {ok} is supported")
    d = hf.get("n_embd", 768)
    if block_size is not None and block_size > hf.get("n_positions", 1024):
        raise _unsupported(where, "n_positions", hf.get("n_positions", 1024),
                           f"learned positions cannot be extended to block_size {block_size}")
    return ModelConfig(
        arch="gpt2", n_layer=hf.get("n_layer", 12), n_head=hf.get("n_head", 12), d_model=d,
        d_ff=hf.get("n_inner") or 4 * d, block_size=block_size or hf.get("n_positions", 1024),
        vocab_size=hf.get("vocab_size", 50257), dropout=0.0, bias=True, qkv_bias=True,
        tie_embeddings=hf.get("tie_word_embeddings", True),
        norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
        activation=act if act in ("gelu", "relu2") else "gelu_tanh",
    )


def _llama_config(hf: dict, where: str, model_type: str, block_size: int | None) -> ModelConfig:
    """The Llama family (llama, mistral, qwen2, qwen3): RoPE, RMSNorm, a SwiGLU MLP, grouped KV heads."""
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise _unsupported(where, "hidden_act", act, "gptforge's Llama MLP is SwiGLU with SiLU")
    d, n_head = hf["hidden_size"], hf["num_attention_heads"]
    head_dim = hf.get("head_dim")
    if head_dim is not None and (head_dim < 1 or head_dim % 2):
        raise _unsupported(where, "head_dim", head_dim, "RoPE needs an even head_dim >= 2")
    # A head_dim other than hidden_size / num_attention_heads (Qwen3, Gemma, pruned models) is head_size.
    head_size = head_dim if head_dim is not None and head_dim * n_head != d else None
    ctx = block_size or hf.get("max_position_embeddings", 2048)
    if model_type in ("qwen2", "qwen3") and hf.get("use_sliding_window", False):
        raise _unsupported(where, "use_sliding_window", True, "sliding-window attention is not implemented")
    bias, qkv_bias = _llama_biases(hf, where, model_type)
    _check_full_attention(hf, where, model_type, ctx)
    theta, scaling = _rope_from_hf(hf, where)
    return ModelConfig(
        arch="llama", n_layer=hf["num_hidden_layers"], n_head=n_head,
        n_kv_head=hf.get("num_key_value_heads") or n_head, d_model=d, d_ff=hf["intermediate_size"],
        block_size=ctx, vocab_size=hf["vocab_size"], dropout=0.0, bias=bias, qkv_bias=qkv_bias,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=theta, rope_scaling=scaling, qk_norm=model_type == "qwen3", head_size=head_size,
    )


def _llama_biases(hf: dict, where: str, model_type: str) -> tuple[bool, bool]:
    """(bias, qkv_bias) of a Llama-family config: gptforge's `bias` covers o_proj and the MLP
    together, `qkv_bias` covers q/k/v. Qwen2 has q/k/v biases only, Qwen3 none; a Llama or
    Mistral config needs attention_bias and mlp_bias equal."""
    if model_type in ("qwen2", "qwen3"):
        if model_type == "qwen3" and hf.get("attention_bias", False):
            raise _unsupported(where, "attention_bias", True, "Qwen3's bias on o_proj without one on the MLP")
        return False, model_type == "qwen2"
    attn_bias, mlp_bias = bool(hf.get("attention_bias", False)), bool(hf.get("mlp_bias", False))
    if attn_bias != mlp_bias:
        raise _unsupported(where, "mlp_bias", mlp_bias, f"attention_bias={attn_bias} with a different mlp_bias")
    return attn_bias, attn_bias


def _check_full_attention(hf: dict, where: str, model_type: str, ctx: int) -> None:
    """Refuse attention other than full causal attention over `ctx` positions: a Mistral sliding
    window shorter than the context, or `layer_types` naming other kinds, except in a Qwen config
    whose `use_sliding_window` is false (its window is then off)."""
    if model_type == "mistral":
        window = hf.get("sliding_window")
        if window is not None and window < ctx:
            raise _unsupported(
                where, "sliding_window", window,
                f"sliding-window attention is not implemented; convert with block_size <= {window}",
            )
    types = hf.get("layer_types")
    if types and any(t != "full_attention" for t in types):
        if not (model_type in ("qwen2", "qwen3") and not hf.get("use_sliding_window", False)):
            raise _unsupported(where, "layer_types", sorted(set(types)), "only full attention is supported")


def hf_model_type(cfg: ModelConfig) -> str:
    """The Hugging Face model_type that represents `cfg` exactly: gpt2, llama, qwen2 or qwen3
    (model.qk_norm: Qwen3's per-head q_norm/k_norm, Yang et al. 2025, Qwen3 technical report,
    section 2).

    Raises:
        UnsupportedHFConfig: a model option no supported architecture has, named (see
            `check_exportable`).
    """
    check_exportable(cfg)
    if cfg.arch == "gpt2":
        return "gpt2"
    if cfg.qk_norm:
        return "qwen3"
    return "qwen2" if (cfg.qkv_bias and not cfg.bias) else "llama"


def check_exportable(cfg: ModelConfig) -> None:
    """Refuse, by option name, a model option no Hugging Face architecture gptforge writes can
    represent: logit_softcap, value_embeddings, qk_norm on gpt2 blocks or with biases, relu2 on
    llama blocks. (zero_init_proj only changes the initialisation: exportable. gpt2 + relu2 is
    GPT-2 with activation_function "relu2".)

    Raises:
        UnsupportedHFConfig: naming `model.<option>` and what to do.
    """
    cfg = cfg.resolved()
    bad: list[tuple[str, Any, str]] = []
    if cfg.logit_softcap:
        bad.append(("logit_softcap", cfg.logit_softcap, "no exported architecture caps the final logits here"))
    if cfg.value_embeddings:
        bad.append(("value_embeddings", True, "no Hugging Face architecture has value embeddings"))
    if cfg.qk_norm and cfg.arch == "gpt2":
        bad.append(("qk_norm", True, "GPT-2 has no QK-norm (llama blocks with qk_norm export as Qwen3)"))
    elif cfg.qk_norm and (cfg.bias or cfg.qkv_bias):
        bad.append(("qk_norm", True, "Qwen3 (QK-norm) has no o_proj/MLP bias: export needs bias=False, qkv_bias=False"))
    if cfg.arch == "llama" and cfg.activation == "relu2":
        bad.append(("activation", "relu2", "Llama-family architectures use SwiGLU"))
    if bad:
        name, value, why = bad[0]
        raise UnsupportedHFConfig(f"model.{name}={value!r} cannot be exported as a Hugging Face model: {why}; "
                                  "a model trained with it stays in gptforge's format (generate, evaluate and serve use it)")


def config_to_hf(cfg: ModelConfig, dtype: torch.dtype = torch.float32, bos_token_id: int | None = None,
                 eos_token_id: int | None = None, base: dict | None = None) -> dict:
    """A Hugging Face `config.json` dict for `cfg` (model_type from `hf_model_type`).

    base: the config.json the model was converted from; when it describes the same shapes it is
    kept (updating dtype and the fields gptforge owns), so a Mistral stays a Mistral and unknown
    fields (e.g. `bos_token_id`) survive a round trip.

    Raises UnsupportedHFConfig naming a model option no architecture here has (`check_exportable`).

    RoPE is written in both spellings, legacy `rope_theta`/`rope_scaling` (transformers 4.x, vLLM)
    and `rope_parameters` (transformers 5), with the same values.
    """
    cfg = cfg.resolved()
    check_exportable(cfg)
    dtype_name = str(dtype).removeprefix("torch.")
    if base is not None:
        try:
            same = _shape_fields(config_from_hf(base, block_size=cfg.block_size)) == _shape_fields(cfg)
        except (UnsupportedHFConfig, KeyError):
            same = False
        if same:
            out = dict(base)
            out["torch_dtype"] = dtype_name
            out.pop("dtype", None)
            if cfg.arch == "llama":
                out.update(_rope_to_hf(cfg))
            return out
    model_type = hf_model_type(cfg)
    if model_type == "gpt2" and cfg.head_dim * cfg.n_head != cfg.d_model:
        # Hugging Face's GPT-2 has no head_dim: its attention width is always n_embd.
        raise _unsupported("model", "head_size", cfg.head_size,
                           f"GPT-2 needs head width d_model/n_head = {cfg.d_model // cfg.n_head}")
    if model_type == "gpt2":
        out = {
            "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": cfg.vocab_size,
            "n_positions": cfg.block_size, "n_embd": cfg.d_model, "n_layer": cfg.n_layer, "n_head": cfg.n_head,
            "n_inner": cfg.d_ff,
            "activation_function": {"gelu": "gelu", "relu2": "relu2"}.get(cfg.activation, "gelu_new"),
            "layer_norm_epsilon": cfg.norm_eps,
            "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout, "attn_pdrop": cfg.dropout,
            "scale_attn_weights": True, "tie_word_embeddings": cfg.tie_embeddings, "use_cache": True,
        }
    else:
        arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[model_type]
        out = {
            "architectures": [arch], "model_type": model_type, "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.n_layer,
            "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.n_kv_head, "head_dim": cfg.head_dim,
            "hidden_act": "silu", "max_position_embeddings": cfg.block_size, "rms_norm_eps": cfg.norm_eps,
            "tie_word_embeddings": cfg.tie_embeddings, "attention_dropout": cfg.dropout, "use_cache": True,
            **_rope_to_hf(cfg),
        }
        if model_type == "llama":
            # A bias on o_proj/MLP without one on q/k/v is written as zero q/k/v biases.
            out["attention_bias"] = out["mlp_bias"] = bool(cfg.bias)
        else:
            out["use_sliding_window"] = False
            if model_type == "qwen3":
                out["attention_bias"] = False
    out["torch_dtype"] = dtype_name
    out["bos_token_id"] = bos_token_id
    out["eos_token_id"] = eos_token_id
    return out


def _rope_to_hf(cfg: ModelConfig) -> dict:
    params = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling:
        params = {**cfg.rope_scaling, "rope_theta": cfg.rope_theta}
    legacy = {k: v for k, v in params.items() if k != "rope_theta"} if cfg.rope_scaling else None
    return {"rope_theta": cfg.rope_theta, "rope_scaling": legacy, "rope_parameters": params}


def _shape_fields(cfg: ModelConfig) -> dict:
    c = replace(cfg, dropout=0.0, attention="sdpa", preset=None)
    return c.__dict__


# ---------------------------------------------------------------------------------------------
# Tensor names

# Buffers some Hugging Face checkpoints carry that are recomputed, never learned.
_IGNORED = re.compile(r"(\.attn\.bias|\.attn\.masked_bias|\.rotary_emb\.inv_freq)$")

_LLAMA_NAMES = [  # (Hugging Face, gptforge); {i} = layer index
    ("model.embed_tokens.weight", "wte.weight"),
    ("model.norm.weight", "norm_f.weight"),
    ("lm_head.weight", "lm_head.weight"),
    ("model.layers.{i}.input_layernorm.weight", "blocks.{i}.norm_1.weight"),
    ("model.layers.{i}.post_attention_layernorm.weight", "blocks.{i}.norm_2.weight"),
] + [
    (f"model.layers.{{i}}.self_attn.{p}.{t}", f"blocks.{{i}}.attn.{p}.{t}")
    for p in ("q_proj", "k_proj", "v_proj", "o_proj") for t in ("weight", "bias")
] + [
    (f"model.layers.{{i}}.self_attn.{p}.weight", f"blocks.{{i}}.attn.{p}.weight") for p in ("q_norm", "k_norm")
] + [
    (f"model.layers.{{i}}.mlp.{p}.{t}", f"blocks.{{i}}.mlp.{p}.{t}")
    for p in ("gate_proj", "up_proj", "down_proj") for t in ("weight", "bias")
]

_GPT2_NAMES = [  # plain renames (weights of Conv1D layers are handled separately)
    ("wte.weight", "wte.weight"), ("wpe.weight", "wpe.weight"), ("lm_head.weight", "lm_head.weight"),
    ("ln_f.weight", "norm_f.weight"), ("ln_f.bias", "norm_f.bias"),
    ("h.{i}.ln_1.weight", "blocks.{i}.norm_1.weight"), ("h.{i}.ln_1.bias", "blocks.{i}.norm_1.bias"),
    ("h.{i}.ln_2.weight", "blocks.{i}.norm_2.weight"), ("h.{i}.ln_2.bias", "blocks.{i}.norm_2.bias"),
    ("h.{i}.attn.c_proj.bias", "blocks.{i}.attn.o_proj.bias"),
    ("h.{i}.mlp.c_fc.bias", "blocks.{i}.mlp.up_proj.bias"),
    ("h.{i}.mlp.c_proj.bias", "blocks.{i}.mlp.down_proj.bias"),
]
# Conv1D weights, stored (in, out): transposed to nn.Linear's (out, in).
_GPT2_CONV = [
    ("h.{i}.attn.c_proj.weight", "blocks.{i}.attn.o_proj.weight"),
    ("h.{i}.mlp.c_fc.weight", "blocks.{i}.mlp.up_proj.weight"),
    ("h.{i}.mlp.c_proj.weight", "blocks.{i}.mlp.down_proj.weight"),
]


def _compile(table):
    out = []
    for src, dst in table:
        pattern = re.compile("^" + re.escape(src).replace(r"\{i\}", r"(\d+)") + "$")
        out.append((pattern, dst))
    return out


_LLAMA_FROM = _compile(_LLAMA_NAMES)
_LLAMA_TO = _compile([(b, a) for a, b in _LLAMA_NAMES])
_GPT2_FROM = _compile(_GPT2_NAMES)
_GPT2_CONV_FROM = _compile(_GPT2_CONV)


def _rename(name: str, table) -> str | None:
    for pattern, dst in table:
        m = pattern.match(name)
        if m:
            return dst.replace("{i}", m.group(1)) if m.groups() else dst
    return None


def state_dict_from_hf(hf_sd: dict[str, torch.Tensor], cfg: ModelConfig, where: str = "checkpoint") -> dict[str, torch.Tensor]:
    """Hugging Face tensors -> gptforge `GPT` state-dict names and layouts.

    GPT-2: Conv1D weights (in, out) are transposed; `c_attn` (d, 3d) is split into q/k/v. A missing
    `lm_head.weight` is filled from the embedding when the model ties them.

    Raises:
        ValueError: a tensor with no gptforge counterpart, or a missing one, naming it and `where`.
    """
    out: dict[str, torch.Tensor] = {}
    unknown = []
    for name, t in hf_sd.items():
        if _IGNORED.search(name):
            continue
        if cfg.arch == "gpt2":
            key = name.removeprefix("transformer.")
            m = re.match(r"^h\.(\d+)\.attn\.c_attn\.(weight|bias)$", key)
            if m:
                i, kind = m.groups()
                t = t.t() if kind == "weight" else t
                q, k, v = t.split(cfg.d_model, dim=0)
                for p, part in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
                    out[f"blocks.{i}.attn.{p}.{kind}"] = part.contiguous()
                continue
            new = _rename(key, _GPT2_CONV_FROM)
            if new is not None:
                out[new] = t.t().contiguous()
                continue
            new = _rename(key, _GPT2_FROM)
        else:
            new = _rename(name, _LLAMA_FROM)
        if new is None:
            unknown.append(name)
        else:
            out[new] = t
    if cfg.arch == "gpt2" and "wpe.weight" in out and out["wpe.weight"].size(0) > cfg.block_size:
        out["wpe.weight"] = out["wpe.weight"][: cfg.block_size]  # a shorter context keeps the first rows
    if unknown:
        raise ValueError(f"{where}: tensors with no gptforge counterpart: {unknown[:8]}{' ...' if len(unknown) > 8 else ''}")
    if "lm_head.weight" not in out and cfg.tie_embeddings and "wte.weight" in out:
        out["lm_head.weight"] = out["wte.weight"]
    return out


def state_dict_to_hf(sd: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """gptforge `GPT` state dict -> Hugging Face names and layouts (for `hf_model_type(cfg)`).

    Tied embeddings: `lm_head.weight` is left out (transformers re-ties it from the embedding).
    GPT-2 arch: q/k/v fused into Conv1D `c_attn` (in, out); missing biases (bias=False) are written
    as zeros and grouped K/V heads are repeated to full heads, both exact. Llama arch with bias but
    no q/k/v bias: zero q/k/v biases.

    Returns contiguous tensors (safetensors needs them) that share no storage.
    """
    cfg = cfg.resolved()
    out: dict[str, torch.Tensor] = {}
    sd = {k: v for k, v in sd.items() if not (cfg.tie_embeddings and k == "lm_head.weight")}
    if cfg.arch == "gpt2":
        d, hd = cfg.d_model, cfg.head_dim
        groups = cfg.n_head // cfg.n_kv_head

        def get(name, shape, like):
            return sd[name] if name in sd else torch.zeros(shape, dtype=like.dtype)

        def full_heads(t):  # (n_kv_head*hd, ...) -> (n_head*hd, ...), each KV head repeated
            if groups == 1:
                return t
            return t.view(cfg.n_kv_head, hd, *t.shape[1:]).repeat_interleave(groups, dim=0).reshape(d, *t.shape[1:])

        like = sd["wte.weight"]
        out["transformer.wte.weight"] = sd["wte.weight"]
        out["transformer.wpe.weight"] = sd["wpe.weight"]
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}.", f"transformer.h.{i}."
            for src, dst in (("norm_1", "ln_1"), ("norm_2", "ln_2")):
                out[h + dst + ".weight"] = sd[b + src + ".weight"]
                out[h + dst + ".bias"] = get(b + src + ".bias", (d,), like)
            qkv_w = [sd[b + "attn.q_proj.weight"]] + [full_heads(sd[b + f"attn.{p}.weight"]) for p in ("k_proj", "v_proj")]
            out[h + "attn.c_attn.weight"] = torch.cat(qkv_w, 0).t()
            qkv_b = [get(b + "attn.q_proj.bias", (d,), like)] + [
                full_heads(get(b + f"attn.{p}.bias", (cfg.n_kv_head * hd,), like)) for p in ("k_proj", "v_proj")
            ]
            out[h + "attn.c_attn.bias"] = torch.cat(qkv_b, 0)
            for src, dst, width in (("attn.o_proj", "attn.c_proj", d), ("mlp.up_proj", "mlp.c_fc", cfg.d_ff),
                                    ("mlp.down_proj", "mlp.c_proj", d)):
                out[h + dst + ".weight"] = sd[b + src + ".weight"].t()
                out[h + dst + ".bias"] = get(b + src + ".bias", (width,), like)
        out["transformer.ln_f.weight"] = sd["norm_f.weight"]
        out["transformer.ln_f.bias"] = get("norm_f.bias", (d,), like)
        if "lm_head.weight" in sd:
            out["lm_head.weight"] = sd["lm_head.weight"]
    else:
        for name, t in sd.items():
            new = _rename(name, _LLAMA_TO)
            if new is None:
                raise ValueError(f"gptforge tensor {name!r} has no Hugging Face counterpart")
            out[new] = t
        if cfg.bias and not cfg.qkv_bias:
            like = sd["wte.weight"]
            for i in range(cfg.n_layer):
                for p, width in (("q_proj", cfg.n_head * cfg.head_dim), ("k_proj", cfg.n_kv_head * cfg.head_dim),
                                 ("v_proj", cfg.n_kv_head * cfg.head_dim)):
                    out[f"model.layers.{i}.self_attn.{p}.bias"] = torch.zeros(width, dtype=like.dtype)
    # Fresh contiguous storage for each tensor: safetensors refuses shared or strided tensors.
    result, seen = {}, set()
    for k, v in out.items():
        v = v.detach()
        if not v.is_contiguous():
            v = v.contiguous()
        elif v.untyped_storage().data_ptr() in seen:
            v = v.clone()
        seen.add(v.untyped_storage().data_ptr())
        result[k] = v
    return result


# ---------------------------------------------------------------------------------------------
# Reading folders

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def read_hf_config(folder: str | Path) -> dict:
    """The `config.json` of a Hugging Face model folder as a dict.

    Raises:
        FileNotFoundError: no folder or no config.json (saying what a model folder holds).
        ValueError: config.json is not valid JSON (with the position).
    """
    folder = Path(folder)
    path = folder / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no config.json; a Hugging Face model folder holds config.json and "
            f"{' or '.join(WEIGHT_FILES[::2])}"
        )
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def read_hf_state_dict(folder: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a Hugging Face model folder, by Hugging Face name, in their stored dtype.

    Reads, in this order of preference: model.safetensors, model.safetensors.index.json (sharded;
    the index's `weight_map` names each tensor's shard), pytorch_model.bin, pytorch_model.bin.index.json.
    .bin files are loaded with `torch.load(weights_only=True)` (no pickled code runs).

    Raises:
        FileNotFoundError: none of those files, or a shard named by the index is missing.
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    if (folder / "model.safetensors").is_file():
        return load_file(str(folder / "model.safetensors"))
    for index_name, loader in (
        ("model.safetensors.index.json", lambda p: load_file(str(p))),
        ("pytorch_model.bin.index.json", lambda p: torch.load(p, map_location="cpu", weights_only=True)),
    ):
        index = folder / index_name
        if not index.is_file():
            if index_name.startswith("model.") and (folder / "pytorch_model.bin").is_file():
                return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
            continue
        weight_map = json.loads(index.read_text())["weight_map"]
        out: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            path = folder / shard
            if not path.is_file():
                raise FileNotFoundError(f"{index}: names shard {shard!r}, which is missing from {folder}")
            out.update(loader(path))
        return out
    raise FileNotFoundError(f"{folder}: no model weights; expected one of {', '.join(WEIGHT_FILES)}")


def load_hf_model(folder: str | Path, dtype: torch.dtype | None = None, device: str | torch.device = "cpu",
                  block_size: int | None = None) -> GPT:
    """Build a gptforge `GPT` holding the weights of a Hugging Face model folder.

    dtype: parameter dtype (default: the checkpoint's). block_size: context length to build
    (default the config's). The model is built on the meta device and takes the loaded tensors
    directly, so peak memory is about one copy of the weights. Tied embeddings stay tied.

    Raises:
        UnsupportedHFConfig, FileNotFoundError, ValueError: see `config_from_hf`,
            `read_hf_state_dict`, `state_dict_from_hf`; shape mismatches name the tensor.
    """
    folder = Path(folder)
    cfg = config_from_hf(read_hf_config(folder), where=str(folder / "config.json"), block_size=block_size)
    sd = state_dict_from_hf(read_hf_state_dict(folder), cfg, where=str(folder))
    return model_from_state_dict(cfg, sd, dtype=dtype, device=device, where=str(folder))


def model_from_state_dict(cfg: ModelConfig, sd: dict[str, torch.Tensor], dtype: torch.dtype | None = None,
                          device: str | torch.device = "cpu", where: str = "state dict") -> GPT:
    """A `GPT(cfg)` whose parameters are the tensors of `sd` (gptforge names), cast to `dtype`.

    Raises:
        ValueError: missing or unexpected tensors, or a shape mismatch, naming them and `where`.
    """
    with torch.device("meta"):
        model = GPT(cfg)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(sd))
    extra = sorted(set(sd) - set(expected))
    if missing or extra:
        raise ValueError(f"{where}: missing tensors {missing[:8]}, unexpected tensors {extra[:8]}")
    for k, shape in expected.items():
        if tuple(sd[k].shape) != tuple(shape):
            raise ValueError(f"{where}: tensor {k} has shape {tuple(sd[k].shape)}, the config implies {tuple(shape)}")
    dtype = dtype or sd["wte.weight"].dtype
    cast = {k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype) for k, v in sd.items()}
    if cfg.tie_embeddings:
        cast["lm_head.weight"] = cast["wte.weight"]
    model.load_state_dict(cast, assign=True)
    if cfg.tie_embeddings:
        # assign=True replaces each Parameter object; re-share the embedding with the head.
        model.lm_head.weight = model.wte.weight
    model.reset_rope()
    return model
