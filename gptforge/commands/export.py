"""`gptforge export RUN_OR_HF_DIR --format hf|onnx|gguf|triton --out DIR`.

    gptforge export runs/tiny --format onnx --out exports/tiny-onnx
    gptforge export runs/tiny --format gguf --quantize q8_0 --out exports/tiny-gguf
    gptforge export runs/tiny --format triton --out exports/triton-repo
    gptforge export runs/tiny --format hf --out exports/tiny-hf    # the same as convert --to-hf

The writers live in gptforge.export (ONNX, GGUF, Triton) and gptforge.model.hf_save (Hugging Face).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional


@dataclass
class ExportOptions:
    source: str
    """Run directory (checkpoints/latest), checkpoint folder, or Hugging Face model folder."""
    format: Literal["hf", "onnx", "gguf", "triton"]
    """Format to write: hf (safetensors folder for transformers / vLLM), onnx (decoder graph with a KV cache
    for onnxruntime), gguf (one file for llama.cpp / ollama), triton (a model repository for Triton's
    onnxruntime backend)."""
    out: str
    """Folder to write (staged beside it, then renamed into place)."""
    dtype: Optional[Literal["f32", "f16", "bf16"]] = None
    """Weight dtype. Default: the source's for hf, f32 for onnx and triton, f16 for gguf. onnx/triton take
    f32 or f16."""
    quantize: Optional[Literal["q8_0", "q4_0", "int8"]] = None
    """Quantize weights: q8_0 or q4_0 for gguf (blocks of 32), int8 for onnx/triton (onnxruntime dynamic
    quantization). hf takes none."""
    name: str = "gptforge"
    """Model name: the Triton model folder, the gguf file's general.name and file name."""
    tokenizer: Optional[str] = None
    """tokenizer.json or tokenizer folder (default: the one in the run directory or its data folder)."""
    approximate_gelu: bool = True
    """gguf: write a GPT-2 trained with exact (erf) GELU for llama.cpp's gpt2 graph, which computes
    the tanh approximation (logits then differ by about 1e-4; a one-line note says so).
    --no-approximate-gelu: refuse such a model instead."""
    max_batch_size: int = 8
    """triton: max_batch_size of config.pbtxt (requests the dynamic batcher may group)."""
    instances: int = 1
    """triton: model instances (instance_group count)."""
    instance_kind: Literal["KIND_AUTO", "KIND_CPU", "KIND_GPU"] = "KIND_AUTO"
    """triton: where instances run (KIND_AUTO: GPUs when there are any)."""
    overwrite: bool = False
    """Replace --out if it exists."""
    quiet: bool = False
    """No progress bars (on a terminal) or progress lines (otherwise) on stderr."""


def _hf(opts: ExportOptions, dtype) -> Path:
    """--format hf: a gptforge run goes through `to_hf`, the code path of `convert --to-hf`; a
    Hugging Face folder is loaded and written again by the same writer (`save_hf`)."""
    from gptforge.runtime.loading import to_hf

    src = Path(opts.source)
    if not (src / "config.json").is_file():
        return to_hf(src, Path(opts.out), dtype, Path(opts.tokenizer) if opts.tokenizer else None,
                     overwrite=opts.overwrite)
    from gptforge.export.common import load_source
    from gptforge.model.hf_save import save_hf

    model, sources = load_source(src, dtype)
    tok_dir = _tokenizer_dir(opts.tokenizer) or sources["tokenizer_dir"]
    return save_hf(model, model.config, opts.out, tokenizer_dir=tok_dir, base_config=sources["hf_config"],
                   generation_config=sources["generation_config"], dtype=dtype, overwrite=opts.overwrite)


def _tokenizer_dir(tokenizer: str | None) -> Path | None:
    from gptforge.errors import InputError, MissingInputError

    if tokenizer is None:
        return None
    p = Path(tokenizer)
    if not p.exists():
        raise MissingInputError(f"--tokenizer {p}: no such file or folder")
    if p.is_file() and p.name != "tokenizer.json":
        raise InputError(f"--tokenizer {p}: expected a tokenizer.json or a folder of tokenizer files")
    return p if p.is_dir() else p.parent


def _gguf(opts: ExportOptions, model, tok_dir: Path | None) -> Path:
    """One .gguf file and an ollama Modelfile naming it, in the folder --out."""
    from gptforge.atomic import staged_dir
    from gptforge.export.gguf import check_representable, gelu_note, gguf_filename, modelfile, write_gguf

    check_representable(model.config, opts.approximate_gelu)  # before anything is written
    dtype = opts.dtype or "f16"
    fname = gguf_filename(opts.name, dtype, opts.quantize)

    def warn(message: str) -> None:  # one line, as generate prints its warnings
        print(f"gptforge export: warning: {message}", file=sys.stderr)

    note = gelu_note(model.config, opts.approximate_gelu)
    if note:
        print(f"gptforge export: note: {note}", file=sys.stderr)
    with staged_dir(opts.out, opts.overwrite) as tmp:
        write_gguf(model, tok_dir, tmp / fname, dtype=dtype, quantize=opts.quantize, name=opts.name,
                   approximate_gelu=opts.approximate_gelu, warn=warn)
        (tmp / "Modelfile").write_text(modelfile(fname, model.config.block_size))
    return Path(opts.out) / fname


def main(argv: list[str]) -> int:
    from gptforge.options import command_parser, parse_command

    parser = command_parser("gptforge export", "Export a run or Hugging Face folder as hf, onnx, gguf or a Triton "
                            "model repository.", ExportOptions, positional=("source",))
    opts, _ = parse_command(parser, argv)
    from gptforge.progress import set_quiet

    set_quiet(opts.quiet)
    import torch

    from gptforge.errors import InputError, require_extra
    from gptforge.export.common import DTYPES, check_export_out, format_packages, load_source

    if opts.quantize is not None:
        allowed = {"gguf": ("q8_0", "q4_0"), "onnx": ("int8",), "triton": ("int8",)}.get(opts.format, ())
        if opts.quantize not in allowed:
            offers = f"it offers {', '.join(allowed)}" if allowed else "it takes no --quantize"
            raise InputError(f"--quantize {opts.quantize} cannot be written in the {opts.format} format: {offers}")
    if opts.format in ("onnx", "triton") and opts.dtype == "bf16":
        raise InputError(f"--dtype bf16 cannot be written in the {opts.format} format (onnxruntime's CPU kernels lack "
                         "bfloat16): use f32 or f16")
    check_export_out(opts.source, opts.out, opts.overwrite, opts.tokenizer)
    require_extra(f"gptforge export --format {opts.format}", "export", format_packages(opts.format, opts.quantize))
    dtype = DTYPES[opts.dtype] if opts.dtype else None
    from gptforge.progress import progress

    if opts.format == "hf":
        with progress("hf export: loading and writing safetensors", 1, "folders") as bar:
            path = _hf(opts, dtype)
            bar.advance()
        print(f"wrote {path}")
        return 0

    # gguf converts from f32 itself; onnx/triton trace the model in the dtype written.
    load_dtype = torch.float32 if opts.format == "gguf" else (dtype or torch.float32)
    with progress(f"loading {opts.source}", 1, "models") as bar:
        model, sources = load_source(opts.source, load_dtype)
        bar.advance()
    tok_dir = _tokenizer_dir(opts.tokenizer) or sources["tokenizer_dir"]
    sources = dict(sources, tokenizer_dir=tok_dir)
    if opts.format == "gguf":
        path = _gguf(opts, model, tok_dir)
    elif opts.format == "onnx":
        from gptforge.export.onnx import export_onnx

        path = export_onnx(model, sources, opts.out, load_dtype, opts.quantize, opts.overwrite)
    else:
        from gptforge.export.triton import export_triton

        path = export_triton(model, sources, opts.out, opts.name, load_dtype, opts.quantize, opts.overwrite,
                             opts.max_batch_size, opts.instances, opts.instance_kind)
    print(f"wrote {path}")
    return 0
