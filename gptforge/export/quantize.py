"""Post-training quantization of a run: int8, int4 or nf4 weights, written as a new run.

`quantize_run(run, spec, out, data)` loads the run, measures it, replaces its block linears
(and with `spec.quantize_embeddings` the embedding and head) by the layers of
`gptforge.model.quant`, measures again and writes an ordinary run directory whose config.yaml has
a `quantization` section; `gptforge.runtime.loading.load_for_inference` (so `evaluate` and
`generate`) loads it, and training or converting it is refused.

Measured (returned and written to quantize.json): bytes of the model's tensors and of its
checkpoint on disk, before (the original weights written the same way to a temporary folder, no
optimizer state) and after, bits per weight of the quantized layers and of
the whole model, validation loss / perplexity before and after with the change in percent
(on the first `max_eval_tokens` tokens of the data's val split), and the median forward time of
one (batch, block_size) batch on the CPU before and after.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, cast

import torch

from gptforge.atomic import atomic_write_text
from gptforge.errors import InputError
from gptforge.export.calibration import folder_bytes, forward_ms, read_split, tensor_bytes
from gptforge.export.run_dir import write_run
from gptforge.model.quant import QuantSpec, quantize_model
from gptforge.progress import progress as show_progress
from gptforge.runtime.checkpoint import save_checkpoint
from gptforge.runtime.loading import load_for_inference


def quantized_bits(model: torch.nn.Module, names: list[str]) -> tuple[int, int]:
    """(bits stored, weights) over the quantized layers `names`: packed codes plus their scales
    and zero points; biases excluded."""
    bits = weights = 0
    for name in names:
        m = model.get_submodule(name)
        weights += int(cast(Any, m).quantized_numel)  # every quantized layer type has quantized_numel
        bits += 8 * sum(b.numel() * b.element_size() for b in m.buffers(recurse=False))
    return bits, weights


def _score(model, tokens) -> dict | None:
    from gptforge.eval.perplexity import evaluate_tokens

    if tokens is None:
        return None
    r = evaluate_tokens(model, tokens, stride=model.config.block_size, batch_size=8, progress=True)
    return {"loss": r.loss, "perplexity": r.perplexity, "tokens": r.tokens}


def _checkpoint_bytes(model: torch.nn.Module, where: Path) -> int:
    """Bytes on disk of `model`'s weights alone written as a checkpoint (a temporary one in
    `where`): the unquantized size measured the way the quantized run is stored."""
    where.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=where, prefix=".quantize-size-") as tmp:
        save_checkpoint(Path(tmp), 0, model, None, {"step": 0}, "", keep=1)
        return folder_bytes(Path(tmp))


def quantize_run(run: str | Path, spec: QuantSpec, out: str | Path, data: str | Path | None = None,
                 max_eval_tokens: int = 32768, batch_size: int = 4, overwrite: bool = False) -> dict:
    """Quantize the run (or checkpoint) `run` as `spec` says and write it to `out`.

    data: shard folder whose val split scores the model before and after (default: the data
    folder the run was trained on, when it still exists; without one, no perplexity is reported).

    Returns: the report dict (see the module docstring), also written to `out`/quantize.json.

    Raises:
        InputError: `run` is already quantized, a bad spec (method, group size not dividing a
            layer's width), or data tokenized with another tokenizer. FileNotFoundError: no
            checkpoint at `run`, or no `data`. FileExistsError: `out` exists and not overwrite.
    """
    model, ckpt, doc, tok = load_for_inference(run, "cpu")
    if doc.get("quantization"):
        raise InputError(f"{run}: already quantized ({doc['quantization']['spec']['method']}); quantize the "
                         f"original run instead (it was {doc['quantization'].get('source')})")
    try:
        spec.validate()
    except ValueError as e:
        raise InputError(str(e)) from None
    data_dir = data if data is not None else (doc.get("data") or {}).get("path")
    tokens = None
    if data_dir is not None and (data is not None or Path(data_dir).is_dir()):
        tokens = read_split(data_dir, "val", max_eval_tokens + 1, (doc.get("data") or {}).get("tokenizer_sha256"))
    cfg = model.config
    gen = torch.Generator().manual_seed(0)
    batch = torch.randint(0, cfg.vocab_size, (batch_size, cfg.block_size), generator=gen)
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; choose another --out or pass --overwrite")
    with show_progress(f"quantize {spec.method}", 4, "steps", info="measuring the original model") as bar:
        before = {"bytes": tensor_bytes(model), "params": model.num_params(), "eval": _score(model, tokens),
                  "forward_ms": forward_ms(model, batch)}
        before["disk_bytes"] = _checkpoint_bytes(model, out.parent)
        bar.advance(info="quantizing")
        try:
            names = quantize_model(model, spec)
        except ValueError as e:
            raise InputError(str(e)) from None
        model.eval()
        bits, weights = quantized_bits(model, names)
        bar.advance(info="measuring the quantized model")
        after = {"bytes": tensor_bytes(model), "eval": _score(model, tokens),
                 "forward_ms": forward_ms(model, batch)}
        bar.advance(info="writing the run")
        report = _write(model, doc, spec, ckpt, tok, out, overwrite, names, bits, weights, before, after,
                        data_dir if tokens is not None else None, batch_size)
        bar.advance()
    return report


def _write(model, doc, spec, ckpt, tok, out: Path, overwrite: bool, names, bits, weights, before, after,
           eval_data, batch_size: int) -> dict:
    """The report of `quantize_run`, and the quantized run written at `out`."""
    cfg = model.config
    report = {
        "source": str(ckpt), "spec": spec.as_dict(), "quantized_layers": len(names),
        "bits_per_weight_quantized_layers": bits / weights,
        "bits_per_weight_model": 8 * after["bytes"] / before["params"],
        "before": before, "after": after, "eval_data": str(eval_data) if eval_data is not None else None,
        "forward_batch": [batch_size, cfg.block_size],
    }
    if before["eval"] and after["eval"]:
        report["perplexity_change_percent"] = 100.0 * (after["eval"]["perplexity"] / before["eval"]["perplexity"] - 1)
    new_doc = dict(doc)
    new_doc["quantization"] = {"spec": spec.as_dict(), "source": str(ckpt)}
    write_run(model, new_doc, out, tok, {"step": 0, "tokens_seen": 0, "quantized_from": str(ckpt)},
              overwrite=overwrite)
    after["disk_bytes"] = folder_bytes(out / "checkpoints")
    atomic_write_text(out / "quantize.json", json.dumps(report, indent=2) + "\n")
    return report


def format_report(r: dict) -> str:
    """The human-readable lines `gptforge quantize` prints for a `quantize_run` report."""
    b, a = r["before"], r["after"]
    lines = [
        f"quantized {r['quantized_layers']} layers with {r['spec']['method']}"
        + (f" (group size {r['spec']['group_size']})" if r["spec"]["method"] != "int8" else " (per output channel)"),
        f"  tensor bytes   {b['bytes']:,} -> {a['bytes']:,} ({a['bytes'] / b['bytes']:.2f}x)",
        f"  on disk        {b['disk_bytes']:,} -> {a['disk_bytes']:,} ({a['disk_bytes'] / b['disk_bytes']:.2f}x) "
        "bytes of the weights' checkpoint",
        f"  bits/weight    {r['bits_per_weight_quantized_layers']:.2f} in the quantized layers, "
        f"{r['bits_per_weight_model']:.2f} over the whole model",
        f"  forward        {b['forward_ms']:.1f} ms -> {a['forward_ms']:.1f} ms per batch of "
        f"{r['forward_batch'][0]}x{r['forward_batch'][1]} tokens (CPU)",
    ]
    if b["eval"] and a["eval"]:
        lines.append(f"  val perplexity {b['eval']['perplexity']:.3f} -> {a['eval']['perplexity']:.3f} "
                     f"({r['perplexity_change_percent']:+.2f}%) over {a['eval']['tokens']:,} tokens of "
                     f"{r['eval_data']}")
    else:
        lines.append("  val perplexity not measured (no --calibration data and the run's data folder is gone)")
    return "\n".join(lines)
