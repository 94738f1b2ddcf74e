"""ONNX export: one decoder graph with KV-cache inputs and outputs, run by onnxruntime.

The graph (`DecoderWithPast`) takes, for a batch of B rows, T new tokens after P cached ones:

    input_ids                   int64 (batch, sequence)                      T new token ids
    attention_mask              int64 (batch, total_sequence)                1 = real token, 0 = padding; P+T columns
    position_ids                int64 (batch, sequence)                      absolute positions of the new tokens
    past_key_values.{i}.key     float (batch, n_kv_head, past_sequence, head_dim)   one pair per layer i
    past_key_values.{i}.value

and returns

    logits                      float (batch, sequence, vocab_size)
    present.{i}.key / .value    float (batch, n_kv_head, total_sequence, head_dim)

A prefill passes pasts of length 0; each decoding step feeds the presents back as the next
pasts. Keys are stored after RoPE (llama), as gptforge's own KV cache stores them. The names
follow the convention of Hugging Face Optimum's decoder exports, so tools that drive those
graphs drive this one. The folder also holds the tokenizer files, `generation_config.json`
and `onnx_io.json` (every input and output with its dtype and dims, and the model facts a
runtime needs: layers, KV heads, head dim, vocabulary, context length, EOS id).

Exported with torch's `torch.export`-based exporter (`torch.onnx.export(dynamo=True)`), opset
18. Example inputs use sizes >= 2 for every dynamic dimension: an example dimension of 1 is
specialised to 1 by torch.export.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from gptforge.errors import InputError
from gptforge.progress import progress as show_progress

if TYPE_CHECKING:
    from gptforge.model.gpt import GPT

OPSET = 18
EXTERNAL_DATA_BYTES = int(1.8 * 2**30)
"""Weights above this size are written to `model.onnx.data` beside the graph (protobuf files stop at 2 GB)."""
IO_FILE = "onnx_io.json"
ONNX_DTYPES = ("f32", "f16")
"""--dtype values the ONNX export writes: onnxruntime's CPU kernels lack most bfloat16 operators."""


class _ConcatCache:
    """The `KVCache` interface over given past tensors: `update` concatenates, keeping the
    result as this layer's present. k, v: (B, n_kv_head, P, head_dim)."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor):
        self.k, self.v = k, v
        self.pos = k.size(2)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = torch.cat([self.k, k], dim=2)
        self.v = torch.cat([self.v, v], dim=2)
        return self.k, self.v


def attention_mask_4d(attention_mask: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Boolean mask (B, 1, T, P+T), True = may attend, for T new queries after P cached keys.

    Query t (absolute position P+t) sees keys 0..P+t whose `attention_mask` (B, P+T) is 1, and
    always itself, so a padding row stays finite (its output is never read) instead of turning
    into NaN that would reach real rows through the next layer's keys.
    """
    total = attention_mask.size(1)
    q = torch.arange(seq_len, device=attention_mask.device)[:, None] + (total - seq_len)
    k = torch.arange(total, device=attention_mask.device)[None, :]
    mask = ((k <= q)[None] & (attention_mask[:, None, :] > 0)) | (k == q)[None]
    return mask[:, None]


class DecoderWithPast(nn.Module):
    """A gptforge GPT as a pure function of (ids, mask, positions, pasts) -> (logits, presents).

    forward(input_ids (B, T), attention_mask (B, P+T), position_ids (B, T), past: tuple of
    2 * n_layer tensors (B, n_kv_head, P, head_dim), key then value per layer) -> tuple of
    logits (B, T, V) and 2 * n_layer presents (B, n_kv_head, P+T, head_dim). Runs the model's
    own blocks (the same code as `GPT.forward` with a KV cache).
    """

    def __init__(self, model: GPT):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, past):
        caches = [_ConcatCache(past[2 * i], past[2 * i + 1]) for i in range(len(past) // 2)]
        mask = attention_mask_4d(attention_mask, input_ids.size(1))
        logits = self.model(input_ids, position_ids=position_ids, attn_mask=mask, caches=caches)
        out = [logits]
        for c in caches:
            out += [c.k, c.v]
        return tuple(out)


def io_names(n_layer: int) -> tuple[list[str], list[str]]:
    """(input names, output names) of the decoder graph, in graph order."""
    pasts = [f"past_key_values.{i}.{kv}" for i in range(n_layer) for kv in ("key", "value")]
    presents = [f"present.{i}.{kv}" for i in range(n_layer) for kv in ("key", "value")]
    return ["input_ids", "attention_mask", "position_ids", *pasts], ["logits", *presents]


def io_spec(cfg, dtype: str) -> dict:
    """The `onnx_io.json` document for ModelConfig `cfg` and float dtype name ("float32"/"float16")."""
    ins, outs = io_names(cfg.n_layer)
    kv = ["batch", cfg.n_kv_head, "past_sequence", cfg.head_dim]
    inputs = {"input_ids": ("int64", ["batch", "sequence"]),
              "attention_mask": ("int64", ["batch", "total_sequence"]),
              "position_ids": ("int64", ["batch", "sequence"])}
    inputs.update({n: (dtype, kv) for n in ins[3:]})
    outputs = {"logits": (dtype, ["batch", "sequence", cfg.vocab_size])}
    outputs.update({n: (dtype, ["batch", cfg.n_kv_head, "total_sequence", cfg.head_dim]) for n in outs[1:]})
    return {
        "format_version": 1,
        "opset": OPSET,
        "inputs": [{"name": n, "dtype": inputs[n][0], "dims": inputs[n][1]} for n in ins],
        "outputs": [{"name": n, "dtype": outputs[n][0], "dims": outputs[n][1]} for n in outs],
        "dims": {"total_sequence": "past_sequence + sequence"},
        "model": {"arch": cfg.arch, "n_layer": cfg.n_layer, "n_kv_head": cfg.n_kv_head, "head_dim": cfg.head_dim,
                  "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.block_size},
    }


def _name_dims(ir_model, spec: dict) -> None:
    """Give the graph's inputs and outputs the readable dim names of `spec` (torch.export names
    them s0, s1, ...), and drop the shapes of inner values, which still use the old names."""
    import onnx_ir as ir

    by_name = {d["name"]: d["dims"] for d in spec["inputs"] + spec["outputs"]}
    g = ir_model.graph
    io = {id(v) for v in list(g.inputs) + list(g.outputs)}
    for v in list(g.inputs) + list(g.outputs):
        v.shape = ir.Shape(by_name[v.name])
    for node in g:
        for v in node.outputs:
            if id(v) not in io:
                v.shape = None


def export_onnx_graph(model: GPT, path: Path, dtype: torch.dtype = torch.float32) -> dict:
    """Write the decoder graph of GPT `model` to the file `path` (weights above 2 GB go to
    `path`.data beside it); returns the `onnx_io.json` dict.

    Raises:
        InputError: a dtype other than float32 / float16.
    """
    import warnings

    from torch.export import Dim

    if dtype not in (torch.float32, torch.float16):
        raise InputError(f"--dtype {dtype}: the onnx format is written as f32 or f16 (onnxruntime's CPU kernels "
                         "lack bfloat16)")
    cfg = model.config
    model = model.to(dtype).eval()
    model.reset_rope()
    wrapper = DecoderWithPast(model).eval()
    # Every dynamic size >= 2 in the example (a 1 is specialised to 1), all distinct tensors.
    B, T, P = 2, 3, 4
    g = torch.Generator().manual_seed(0)
    past = tuple(torch.randn(B, cfg.n_kv_head, P, cfg.head_dim, generator=g).to(dtype)
                 for _ in range(2 * cfg.n_layer))
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    am = torch.ones(B, P + T, dtype=torch.long)
    pos = torch.arange(P, P + T).expand(B, T).contiguous()
    auto = Dim.AUTO  # total = past + seq is a relation torch.export infers, not one Dim can state
    shapes = ({0: auto, 1: auto}, {0: auto, 1: auto}, {0: auto, 1: auto},
              tuple({0: auto, 2: auto} for _ in past))
    ins, outs = io_names(cfg.n_layer)
    # The exporter's registry logs one warning per torchvision op it cannot register when
    # torchvision is absent; a GPT uses none of them.
    registry_log = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registry_log.level
    registry_log.setLevel(logging.ERROR)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        try:
            program = torch.onnx.export(wrapper, (ids, am, pos, past), dynamo=True, dynamic_shapes=shapes,
                                        opset_version=OPSET, input_names=ins, output_names=outs, verbose=False)
        finally:
            registry_log.setLevel(level)
    spec = io_spec(cfg, "float32" if dtype == torch.float32 else "float16")
    _name_dims(program.model, spec)
    # Weights near protobuf's 2 GB limit go to model.onnx.data beside the graph.
    program.save(str(path), external_data=_weight_bytes(model) > EXTERNAL_DATA_BYTES)
    return spec


def _weight_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def quantize_int8(src: Path, dst: Path, external_data: bool = False) -> None:
    """onnxruntime dynamic quantization of `src` into `dst`: MatMul / Gather weights as int8 with
    per-tensor scales, activations quantized at run time (onnxruntime.quantization.quantize_dynamic).
    external_data: write the weights to a `.data` file beside `dst`."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, use_external_data_format=external_data)


def write_onnx_folder(model: GPT, sources: dict, folder: Path, dtype: torch.dtype = torch.float32,
                      quantize: str | None = None) -> dict:
    """Write model.onnx, onnx_io.json, the tokenizer files and generation_config.json into the
    existing folder `folder`; returns the onnx_io.json dict. See `export_onnx`."""
    import shutil

    from gptforge.export.common import tokenizer_files

    if quantize not in (None, "int8"):
        raise InputError(f"--quantize {quantize} cannot be written in the onnx format: it offers int8 "
                         "(onnxruntime dynamic quantization)")
    if quantize == "int8" and dtype != torch.float32:
        raise InputError("--quantize int8 with the onnx format quantizes f32 weights; pass --dtype f32")
    cfg = model.config
    tok = tokenizer_files(sources.get("tokenizer_dir"), cfg.block_size)
    gen = _generation_config(sources, tok)
    with show_progress("onnx export", 3 if quantize == "int8" else 2, "steps",
                       info="tracing the model (torch.onnx.export)") as bar:
        if quantize == "int8":
            (folder / ".fp32").mkdir()
            spec = export_onnx_graph(model, folder / ".fp32" / "model.onnx", dtype)
            bar.advance(info="quantizing to int8 (onnxruntime)")
            quantize_int8(folder / ".fp32" / "model.onnx", folder / "model.onnx",
                          external_data=_weight_bytes(model) // 4 > EXTERNAL_DATA_BYTES)
            shutil.rmtree(folder / ".fp32")
            spec["quantization"] = "int8 dynamic (onnxruntime.quantization.quantize_dynamic, QInt8 weights)"
        else:
            spec = export_onnx_graph(model, folder / "model.onnx", dtype)
        bar.advance(info="writing the tokenizer and configs")
        if gen.get("eos_token_id") is not None:
            spec["model"]["eos_token_id"] = gen["eos_token_id"]
        (folder / IO_FILE).write_text(json.dumps(spec, indent=2) + "\n")
        (folder / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")
        for name, data in tok.items():
            (folder / name).write_bytes(data)
        bar.advance()
    return spec


def export_onnx(model: GPT, sources: dict, out: str | Path, dtype: torch.dtype = torch.float32,
                quantize: str | None = None, overwrite: bool = False) -> Path:
    """Write an ONNX folder at `out` (staged, then renamed into place): model.onnx,
    onnx_io.json, tokenizer files, generation_config.json.

    sources: `load_pretrained`'s dict (tokenizer_dir, generation_config). quantize: None or
    "int8" (see `quantize_int8`; needs f32 weights).

    Raises:
        InputError: `out` exists without overwrite, an unsupported dtype or quantization.
        MissingInputError: no tokenizer (see `tokenizer_files`).
    """
    from gptforge.atomic import staged_dir

    with staged_dir(out, overwrite) as tmp:
        write_onnx_folder(model, sources, tmp, dtype, quantize)
    return Path(out)


def _generation_config(sources: dict, tok: dict[str, bytes]) -> dict:
    """generation_config.json: the source's, else BOS/EOS ids from the tokenizer files."""
    if sources.get("generation_config"):
        return dict(sources["generation_config"])
    if "tokenizer.json" not in tok:
        return {}
    specials = {t["content"]: t["id"] for t in json.loads(tok["tokenizer.json"]).get("added_tokens", [])}
    tcfg = json.loads(tok["tokenizer_config.json"]) if "tokenizer_config.json" in tok else {}
    out = {}
    for key in ("bos_token", "eos_token"):
        name = tcfg.get(key)
        name = name.get("content") if isinstance(name, dict) else name
        if name in specials:
            out[key + "_id"] = specials[name]
    return out


class OnnxDecoder:
    """Run an exported ONNX folder with onnxruntime: `logits` for one call, `greedy` to continue.

    `OnnxDecoder(folder)` opens folder/model.onnx on the CPU (or pass `providers`).
    """

    def __init__(self, folder: str | Path, providers: list[str] | None = None):
        import onnxruntime as ort

        folder = Path(folder)
        self.spec = json.loads((folder / IO_FILE).read_text())
        opts = ort.SessionOptions()
        self.session = ort.InferenceSession(str(folder / "model.onnx"), opts,
                                            providers=providers or ["CPUExecutionProvider"])
        m = self.spec["model"]
        self.n_layer, self.n_kv_head, self.head_dim = m["n_layer"], m["n_kv_head"], m["head_dim"]
        import numpy as np

        self.float_dtype = np.float16 if self.spec["inputs"][3]["dtype"] == "float16" else np.float32

    def empty_past(self, batch: int) -> list:
        """2 * n_layer zero-length pasts (batch, n_kv_head, 0, head_dim) for a prefill."""
        import numpy as np

        return [np.zeros((batch, self.n_kv_head, 0, self.head_dim), self.float_dtype) for _ in range(2 * self.n_layer)]

    def run(self, input_ids, past=None, attention_mask=None, position_ids=None):
        """One graph call. input_ids: int64 array (B, T); past: list of 2 * n_layer arrays
        (B, n_kv_head, P, hd) or None (prefill); attention_mask (B, P+T) default all ones;
        position_ids (B, T) default P..P+T-1. Returns (logits (B, T, V), presents list)."""
        import numpy as np

        input_ids = np.asarray(input_ids, dtype=np.int64)
        B, T = input_ids.shape
        past = self.empty_past(B) if past is None else past
        P = past[0].shape[2]
        if attention_mask is None:
            attention_mask = np.ones((B, P + T), np.int64)
        if position_ids is None:
            position_ids = np.broadcast_to(np.arange(P, P + T, dtype=np.int64), (B, T)).copy()
        names = [i.name for i in self.session.get_inputs()]
        feeds = dict(zip(names, [input_ids, np.asarray(attention_mask, np.int64),
                                 np.asarray(position_ids, np.int64), *past], strict=False))
        out = self.session.run(None, feeds)
        return out[0], out[1:]

    def greedy(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        """Greedy continuation of one prompt: prefill, then one token per call with the KV
        cache fed back. Returns prompt + new ids."""
        import numpy as np

        ids = list(prompt)
        logits, past = self.run(np.array([ids]))
        for _ in range(max_new_tokens):
            nxt = int(np.argmax(logits[0, -1]))
            ids.append(nxt)
            logits, past = self.run(np.array([[nxt]]), past)
        return ids
