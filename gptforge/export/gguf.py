"""GGUF export (llama.cpp, ollama) with gguf-py, the llama.cpp project's own writer.

A gptforge GPT becomes one `.gguf` file:

- architecture `llama` (RoPE, RMSNorm, SwiGLU, grouped-query attention, tied or untied head),
  `qwen3` (the same with model.qk_norm: per-head RMSNorm `attn_q_norm` / `attn_k_norm` on q and
  k before RoPE, no biases; Yang et al. 2025, Qwen3 technical report, section 2) or `gpt2`
  (learned positions, LayerNorm, tanh-GELU MLP, q/k/v fused into `attn_qkv`); the head width
  (`attention.key_length` / `value_length`) is written, so a pruned head_size loads;
- weights in f32, f16 or bf16, or quantized to q8_0 / q4_0 (blocks of 32 values, one f16 scale per
  block; llama.cpp's `ggml-quants.c` formats as gguf-py implements them). Norms, biases and
  RoPE factors stay f32, as llama.cpp's own converter keeps them; a matrix whose rows are not a
  multiple of 32 long is written f16, with a warning naming each such tensor;
- the byte-level BPE tokenizer embedded: tokens, merges, token types (special tokens CONTROL,
  vocabulary padding UNUSED), BOS/EOS ids, pre-tokenizer `gpt-2` (GPT-2's regex, the one
  gptforge's tokenizer uses), and the chat template when the tokenizer has one;
- context length (`block_size`), RoPE base, and RoPE scaling: `linear` as
  `rope.scaling.type`/`factor`; `llama3` as the per-frequency divisor tensor `rope_freqs` that
  llama.cpp applies (inv_freq / scaled inv_freq, from `gptforge.model.gpt.scale_rope_frequencies`).

gptforge keeps q/k in the Hugging Face layout (rotate the first half of the head dim against the
second); llama.cpp's `llama` rotates adjacent pairs. Rows of q and k are permuted per head from
(half, pair) order to (pair, half) order, as llama.cpp's convert_hf_to_gguf.py does (with the KV
head count for k), so both compute the same attention. Its `qwen3` rotates halves (NeoX RoPE), as
gptforge does: q and k are written as they are.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from gptforge.errors import InputError
from gptforge.progress import progress as show_progress

if TYPE_CHECKING:
    from gptforge.model.gpt import GPT

GGUF_DTYPES = ("f32", "f16", "bf16")
GGUF_QUANTS = ("q8_0", "q4_0")
QK = 32
"""Values per q8_0 / q4_0 block (ggml's QK8_0 = QK4_0 = 32)."""


def permute_rope_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Reorder the output rows of a q or k projection (n_head * head_dim, ...) from the Hugging
    Face RoPE layout to llama.cpp's interleaved one: within each head, row (half h, index i) moves
    to (index i, half h). Biases (1-D) are permuted the same way."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_arch(cfg) -> str:
    """The llama.cpp architecture that computes `cfg`: gpt2, qwen3 (llama blocks with qk_norm) or llama."""
    if cfg.arch == "gpt2":
        return "gpt2"
    return "qwen3" if cfg.qk_norm else "llama"


def check_representable(cfg, approximate_gelu: bool = True) -> None:
    """Refuse what llama.cpp's `llama` / `qwen3` / `gpt2` graphs cannot compute, naming every such option.

    Not representable: logit_softcap (no graph caps the final logits), value_embeddings,
    qk_norm on gpt2 blocks, qk_norm with biases or llama3 RoPE scaling (llama.cpp's qwen3 has
    neither), relu2 (llama.cpp's llama and qwen3 use SwiGLU, its gpt2 GELU), exact GELU in a
    GPT-2 when approximate_gelu is False (llama.cpp's gpt2 uses the tanh approximation; the
    default accepts it, see `gelu_note`), a
    rope_scaling type other than linear / llama3. (zero_init_proj only changes the
    initialisation: representable.)

    Raises:
        InputError: one message naming each `model.<option>=<value>` and why.
    """
    cfg = cfg.resolved()
    bad = []  # (option=value, why)
    if cfg.logit_softcap:
        bad.append((f"model.logit_softcap={cfg.logit_softcap!r}", f"llama.cpp's {cfg.arch} graph does not cap the "
                    "final logits"))
    if cfg.value_embeddings:
        bad.append(("model.value_embeddings=True", f"llama.cpp's {cfg.arch} graph has no value embeddings"))
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if cfg.qk_norm and cfg.arch == "gpt2":
        bad.append(("model.qk_norm=True", "llama.cpp's gpt2 graph has no per-head q/k norm (llama blocks with "
                    "qk_norm export as qwen3)"))
    elif cfg.qk_norm and (cfg.bias or cfg.qkv_bias):
        bad.append(("model.qk_norm=True with biases", "llama.cpp's qwen3 graph (QK-norm) has no biases: it needs "
                    "model.bias=False and model.qkv_bias=False"))
    elif cfg.qk_norm and kind == "llama3":
        bad.append(("model.qk_norm=True with rope_scaling llama3", "llama.cpp's qwen3 graph applies no per-frequency "
                    "RoPE factors"))
    if cfg.activation == "relu2":
        mlp = "a SwiGLU" if cfg.arch == "llama" else "a GELU"
        bad.append(("model.activation=relu2", f"llama.cpp's {cfg.arch} graph computes {mlp} MLP"))
    if cfg.arch == "gpt2" and cfg.activation == "gelu" and not approximate_gelu:
        bad.append(("model.activation=gelu (exact, erf)", "llama.cpp's gpt2 graph computes the tanh approximation "
                    "(model.activation=gelu_tanh); drop --no-approximate-gelu to export it anyway (logits then "
                    "differ by about 1e-4)"))
    if cfg.arch == "llama" and kind not in ("default", "linear", "llama3"):
        bad.append((f"model.rope_scaling.rope_type={kind}", "linear and llama3 can"))
    if bad:
        raise InputError("; ".join(f"{opt} cannot be represented in the gguf format: {why}" for opt, why in bad)
                         + ". A model trained with it stays in gptforge's format (generate, evaluate and serve "
                         "use it)")


def gelu_note(cfg, approximate_gelu: bool = True) -> str | None:
    """The one-line note for a GPT-2 with exact GELU written for llama.cpp's tanh-GELU graph, or None.

    The tanh approximation (Hendrycks & Gimpel 2016, section 2) differs from erf-GELU by at most
    4.7e-4 per activation (at |x| = 2.7); on a gpt2-nano run llama.cpp's logits moved by at most
    2e-4 (bench/RESULTS.md).
    """
    cfg = cfg.resolved()
    if cfg.arch == "gpt2" and cfg.activation == "gelu" and approximate_gelu:
        return ("model.activation=gelu (exact, erf) is written for llama.cpp's gpt2 graph, which computes the tanh "
                "approximation: its logits differ from gptforge's by about 1e-4 (train with --model.activation "
                "gelu_tanh for an exact gguf)")
    return None


def read_tokenizer(tokenizer_json: Path, vocab_size: int) -> dict:
    """The GGUF tokenizer fields of a byte-level BPE tokenizer.json.

    Returns {"tokens": [str] * vocab_size, "types": [int], "merges": ["a b"], "eos_id",
    "bos_id"}. Ids the tokenizer does not use up to the model's vocab_size become `[PAD{id}]`
    tokens of type UNUSED.

    Raises:
        InputError: not a BPE model, a pre-tokenizer other than GPT-2's byte-level regex, more
            tokens than the model's vocabulary, or no end-of-text token.
    """
    import gguf

    from gptforge.model.hf_save import EOS_CANDIDATES

    doc = json.loads(Path(tokenizer_json).read_text())
    model = doc.get("model") or {}
    if model.get("type") != "BPE":
        raise InputError(f"{tokenizer_json}: the gguf export embeds byte-level BPE tokenizers; this one is "
                         f"{model.get('type')!r}")
    pre = doc.get("pre_tokenizer") or {}
    if not (pre.get("type") == "ByteLevel" and pre.get("use_regex", True)):
        raise InputError(f"{tokenizer_json}: pre_tokenizer {pre.get('type')!r} has no llama.cpp pre-tokenizer id the "
                         "gguf export knows; it writes GPT-2's byte-level regex (pre_tokenizer ByteLevel)")
    vocab: dict[str, int] = dict(model["vocab"])
    added = {t["content"]: t for t in doc.get("added_tokens", [])}
    for content, t in added.items():
        vocab[content] = t["id"]
    n = max(vocab.values()) + 1
    if n > vocab_size:
        raise InputError(f"{tokenizer_json}: {n} tokens but the model's vocab_size is {vocab_size}")
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [int(gguf.TokenType.UNUSED)] * vocab_size
    for content, i in vocab.items():
        tokens[i] = content
        special = content in added and added[content].get("special", False)
        types[i] = int(gguf.TokenType.CONTROL if special else gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    eos = next((added[t]["id"] for t in EOS_CANDIDATES if t in added), None)
    if eos is None:
        raise InputError(f"{tokenizer_json}: no end-of-text special token ({', '.join(EOS_CANDIDATES)})")
    return {"tokens": tokens, "types": types, "merges": merges, "eos_id": eos, "bos_id": eos}


def chat_template(tokenizer_dir: Path) -> str | None:
    """The tokenizer folder's chat template as gptforge's chat formatting reads it
    (`gptforge.data.chat.ChatTokenizer.from_dir`: chat_template.jinja, chat_template.json or
    tokenizer_config.json), or None."""
    from gptforge.data.chat import ChatTokenizer

    template = ChatTokenizer.from_dir(tokenizer_dir).chat_template
    return template if isinstance(template, str) and template else None


def gguf_tensors(model: GPT) -> list[tuple[str, torch.Tensor]]:
    """(GGUF name, tensor in GGUF row order) for every weight of GPT `model`, in file order.

    llama: token_embd, blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate,
    ffn_up, ffn_down}, output_norm, output (absent when tied), rope_freqs (llama3 scaling); q and k
    rows permuted (`permute_rope_rows`). qwen3: the same plus blk.N.{attn_q_norm, attn_k_norm}
    (head_dim,), q and k unpermuted.
    gpt2: token_embd, position_embd, blk.N.{attn_norm, attn_qkv, attn_output, ffn_norm, ffn_up,
    ffn_down} (+ .bias each; zeros where the model has none, as llama.cpp's gpt2 reads them),
    output_norm, output (absent when tied). Shapes as in torch: (out_features, in_features).
    """
    from gptforge.model.gpt import scale_rope_frequencies

    cfg = model.config
    sd = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    out: list[tuple[str, torch.Tensor]] = [("token_embd.weight", sd["wte.weight"])]
    gpt2, qwen3 = cfg.arch == "gpt2", gguf_arch(cfg) == "qwen3"
    rows = (lambda w, heads: w) if qwen3 else permute_rope_rows
    if gpt2:
        out.append(("position_embd.weight", sd["wpe.weight"]))

    def bias(key: str, n: int) -> torch.Tensor:
        return sd[key] if key in sd else torch.zeros(n)

    for i in range(cfg.n_layer):
        p, b = f"blocks.{i}.", f"blk.{i}."
        q, k, v = (sd[p + f"attn.{x}_proj.weight"] for x in "qkv")
        if gpt2:
            out.append((b + "attn_norm.weight", sd[p + "norm_1.weight"]))
            out.append((b + "attn_norm.bias", bias(p + "norm_1.bias", cfg.d_model)))
            out.append((b + "attn_qkv.weight", torch.cat([q, k, v])))
            qkv_b = [bias(p + f"attn.{x}_proj.bias", w.shape[0]) for x, w in zip("qkv", (q, k, v), strict=True)]
            out.append((b + "attn_qkv.bias", torch.cat(qkv_b)))
            out.append((b + "attn_output.weight", sd[p + "attn.o_proj.weight"]))
            out.append((b + "attn_output.bias", bias(p + "attn.o_proj.bias", cfg.d_model)))
            out.append((b + "ffn_norm.weight", sd[p + "norm_2.weight"]))
            out.append((b + "ffn_norm.bias", bias(p + "norm_2.bias", cfg.d_model)))
            out.append((b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"]))
            out.append((b + "ffn_up.bias", bias(p + "mlp.up_proj.bias", cfg.d_ff)))
            out.append((b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"]))
            out.append((b + "ffn_down.bias", bias(p + "mlp.down_proj.bias", cfg.d_model)))
            continue
        out.append((b + "attn_norm.weight", sd[p + "norm_1.weight"]))
        out.append((b + "attn_q.weight", rows(q, cfg.n_head)))
        if qwen3:
            out.append((b + "attn_q_norm.weight", sd[p + "attn.q_norm.weight"]))
        out.append((b + "attn_k.weight", rows(k, cfg.n_kv_head)))
        if qwen3:
            out.append((b + "attn_k_norm.weight", sd[p + "attn.k_norm.weight"]))
        out.append((b + "attn_v.weight", v))
        for x, heads in (("q", cfg.n_head), ("k", cfg.n_kv_head), ("v", None)):
            key = p + f"attn.{x}_proj.bias"
            if key in sd:
                out.append((b + f"attn_{x}.bias", sd[key] if heads is None else rows(sd[key], heads)))
        out.append((b + "attn_output.weight", sd[p + "attn.o_proj.weight"]))
        out.append((b + "ffn_norm.weight", sd[p + "norm_2.weight"]))
        out.append((b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"]))
        out.append((b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"]))
        out.append((b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"]))
        for name, key in (("attn_output", "attn.o_proj"), ("ffn_gate", "mlp.gate_proj"), ("ffn_up", "mlp.up_proj"),
                          ("ffn_down", "mlp.down_proj")):
            if p + key + ".bias" in sd:
                out.append((b + name + ".bias", sd[p + key + ".bias"]))
    out.append(("output_norm.weight", sd["norm_f.weight"]))
    if "norm_f.bias" in sd or gpt2:
        out.append(("output_norm.bias", bias("norm_f.bias", cfg.d_model)))
    if not cfg.tie_embeddings:
        out.append(("output.weight", sd["lm_head.weight"]))
    scaling = cfg.rope_scaling or {}
    if not gpt2 and scaling.get("rope_type", scaling.get("type")) == "llama3":
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
        out.append(("rope_freqs.weight", (inv / scale_rope_frequencies(inv, scaling)).float()))
    return out


def tensor_type(name: str, t: torch.Tensor, dtype: str, quantize: str | None):
    """The GGMLQuantizationType a tensor is stored in (see the module docstring)."""
    import gguf

    T = gguf.GGMLQuantizationType
    if t.dim() == 1 or name.startswith("position_embd") or name.startswith("rope_freqs"):
        return T.F32
    if quantize is not None:
        if t.shape[-1] % QK == 0:
            return {"q8_0": T.Q8_0, "q4_0": T.Q4_0}[quantize]
        return T.F16
    return {"f32": T.F32, "f16": T.F16, "bf16": T.BF16}[dtype]


def file_type(dtype: str, quantize: str | None):
    """general.file_type: the LlamaFileType of the bulk of the weights."""
    import gguf

    F = gguf.LlamaFileType
    if quantize:
        return {"q8_0": F.MOSTLY_Q8_0, "q4_0": F.MOSTLY_Q4_0}[quantize]
    return {"f32": F.ALL_F32, "f16": F.MOSTLY_F16, "bf16": F.MOSTLY_BF16}[dtype]


def write_gguf(model: GPT, tokenizer_dir: Path | None, path: str | Path, dtype: str = "f16",
               quantize: str | None = None, name: str = "gptforge", approximate_gelu: bool = True,
               warn=None) -> Path:
    """Write GPT `model` and its tokenizer as the GGUF file `path`.

    dtype: f32 | f16 | bf16 for matrices; quantize: None | q8_0 | q4_0 (overrides dtype for
    matrices whose rows are a multiple of 32). tokenizer_dir: folder with tokenizer.json (and
    tokenizer_config.json for a chat template). warn: called with the message naming the matrices
    kept in f16 under quantize (`kept_f16_message`); default: a Python UserWarning.

    Raises:
        InputError: an option the format cannot represent (see `check_representable`,
            `read_tokenizer`), an unknown dtype / quantization.
        MissingInputError: no tokenizer.json in tokenizer_dir.
    """
    import gguf

    from gptforge.errors import MissingInputError

    if dtype not in GGUF_DTYPES:
        raise InputError(f"--dtype {dtype}: the gguf format writes {', '.join(GGUF_DTYPES)}")
    if quantize not in (None, *GGUF_QUANTS):
        raise InputError(f"--quantize {quantize}: the gguf format offers {', '.join(GGUF_QUANTS)}")
    cfg = model.config
    check_representable(cfg, approximate_gelu)
    if tokenizer_dir is None or not (Path(tokenizer_dir) / "tokenizer.json").is_file():
        raise MissingInputError(f"{tokenizer_dir or 'the run'}: no tokenizer.json to embed in the gguf file")
    tokenizer_dir = Path(tokenizer_dir)
    tok = read_tokenizer(tokenizer_dir / "tokenizer.json", cfg.vocab_size)

    path = Path(path)
    w = gguf.GGUFWriter(str(path), gguf_arch(cfg))
    w.add_name(name)
    _add_hparams(w, cfg, dtype, quantize)

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["types"])
    w.add_token_merges(tok["merges"])
    w.add_bos_token_id(tok["bos_id"])
    w.add_eos_token_id(tok["eos_id"])
    w.add_add_bos_token(False)  # gptforge trains without a BOS token
    w.add_add_eos_token(False)
    template = chat_template(tokenizer_dir)
    if template is not None:
        w.add_chat_template(template)

    tensors = gguf_tensors(model)
    kept_f16 = []  # (name, shape) of matrices quantize could not take
    with show_progress(f"gguf: converting tensors to {quantize or dtype}", len(tensors), "tensors") as bar:
        for tname, t in tensors:
            qtype = tensor_type(tname, t, dtype, quantize)
            data = t.numpy().astype(np.float32)
            if qtype == gguf.GGMLQuantizationType.F32:
                w.add_tensor(tname, data)
            elif qtype == gguf.GGMLQuantizationType.F16:
                w.add_tensor(tname, data.astype(np.float16))
                if quantize is not None:
                    kept_f16.append((tname, tuple(t.shape)))
            else:
                w.add_tensor(tname, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
            bar.advance()
    if kept_f16:
        message = kept_f16_message(kept_f16, quantize, len(tensors))
        if warn is None:
            warnings.warn(message, stacklevel=2)
        else:
            warn(message)
    with show_progress(f"gguf: writing {path.name}", 1, "files") as bar:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file(progress=False)
        w.close()
        bar.advance()
    return path


def _add_hparams(w, cfg, dtype: str, quantize: str | None) -> None:
    """The model's shape, norm, RoPE and file-type keys of GGUF writer `w` (see the module docstring)."""
    import gguf

    w.add_context_length(cfg.block_size)
    w.add_embedding_length(cfg.d_model)
    w.add_block_count(cfg.n_layer)
    w.add_feed_forward_length(cfg.d_ff)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(cfg.n_kv_head)
    w.add_vocab_size(cfg.vocab_size)
    if cfg.arch == "llama":
        w.add_layer_norm_rms_eps(cfg.norm_eps)
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
        w.add_rope_dimension_count(cfg.head_dim)
        w.add_rope_freq_base(cfg.rope_theta)
        scaling = cfg.rope_scaling or {}
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(float(scaling["factor"]))
        # llama3: only the rope_freqs tensor. A rope.scaling.factor key would make llama.cpp
        # apply linear scaling on top (its default scaling type is linear).
    else:
        w.add_layer_norm_eps(cfg.norm_eps)
    w.add_file_type(file_type(dtype, quantize))
    if quantize:
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def kept_f16_message(kept: list[tuple[str, tuple[int, ...]]], quantize: str, n_tensors: int) -> str:
    """The warning for matrices written f16 under --quantize: each one's name and shape, and why
    (a q8_0 / q4_0 block holds QK values of one row, so a row length must be a multiple of QK)."""
    shown = ", ".join(f"{n} {list(s)} (row of {s[-1]}, {s[-1] % QK} left over)" for n, s in kept[:8])
    more = f" and {len(kept) - 8} more" if len(kept) > 8 else ""
    return (f"--quantize {quantize}: {len(kept)} of {n_tensors} tensors kept in f16 because their row length is "
            f"not a multiple of the {QK}-value block: {shown}{more}. Row lengths are d_model, d_ff and "
            f"n_head x head_dim: a model with all three multiples of {QK} quantizes every matrix")


def quant_error_bound(block: np.ndarray, qtype: str) -> float:
    """Largest |x - dequant(quant(x))| the format allows for one block of 32 values.

    q8_0: scale d = max|x| / 127, values rounded to the nearest step: d / 2. q4_0: d = m / -8
    with m the value of largest magnitude, values truncated after adding 8.5 (round to
    nearest) and clamped to 15: |d| / 2 except at the clamp, where one step more is lost: |d|.
    Both with the scale stored as f16 (relative error 2^-11 on every value).
    """
    m = float(np.abs(block).max())
    if qtype == "q8_0":
        step = m / 127
        return step / 2 + m * 2.0**-10 + 1e-12
    if qtype == "q4_0":
        step = m / 8
        return step + m * 2.0**-10 + 1e-12
    raise ValueError(qtype)


def gguf_filename(name: str, dtype: str, quantize: str | None) -> str:
    """`<name>-<q8_0|q4_0|f16|...>.gguf`, the naming llama.cpp's converter uses."""
    return f"{name}-{quantize or dtype}.gguf"



def modelfile(gguf_name: str, block_size: int) -> str:
    """The ollama Modelfile written beside `gguf_name`: the file, and `num_ctx` set to the
    trained context (`block_size` tokens), since ollama's default context (2048 or more) would
    run the model past the positions it was trained on."""
    return f"FROM ./{gguf_name}\nPARAMETER num_ctx {int(block_size)}\n"
