"""The export formats, one registry entry each, and `export_model`, which `gptforge export` calls.

Each `ExportFormat` says what its format can hold (the `--dtype` and `--quantize` values it
writes, and why others are refused), the dtype written when `--dtype` is not given, and its
writer. `export_model` refuses an option the format cannot hold before anything is loaded or
written, then calls the writer:

    hf      safetensors folder, through `runtime.loading.to_hf` (a run) or `model.hf_save.save_hf`
    gguf    one .gguf file and an ollama Modelfile (`export.gguf.write_gguf`)
    onnx    a decoder graph with a KV cache (`export.onnx.export_onnx`)
    triton  a Triton model repository around that graph (`export.triton.export_triton`)

The options are the fields of `ExportOptions` (the command's options, documented there). This
module imports torch and the writers only when a function runs, so `gptforge export --help`
stays fast.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal, Optional

from gptforge.ranges import bounded

if TYPE_CHECKING:
    from gptforge.model.gpt import GPT

if TYPE_CHECKING:
    import torch

INT32_MAX = 2**31 - 1
"""Triton's config.pbtxt holds max_batch_size and the instance count as int32."""


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
    max_batch_size: int = bounded(8, low=1, high=INT32_MAX)
    """triton: max_batch_size of config.pbtxt (requests the dynamic batcher may group)."""
    instances: int = bounded(1, low=1, high=INT32_MAX)
    """triton: model instances (instance_group count)."""
    instance_kind: Literal["KIND_AUTO", "KIND_CPU", "KIND_GPU"] = "KIND_AUTO"
    """triton: where instances run (KIND_AUTO: GPUs when there are any)."""
    overwrite: bool = False
    """Replace --out if it exists."""
    quiet: bool = False
    """No progress bars (on a terminal) or progress lines (otherwise) on stderr."""


Writer = Callable[[ExportOptions, Optional[str]], Path]
"""A format's writer: (options, dtype to write or None for the source's) -> the path written."""


@dataclass(frozen=True)
class ExportFormat:
    """What one export format holds and how it is written."""

    name: str
    """The `--format` value."""
    write: Writer
    """Loads the source and writes `--out`; called once the options passed `check`."""
    default_dtype: Optional[str]
    """The `--dtype` written when none is given; None: the source's own."""
    dtypes: tuple[str, ...] = ("f32", "f16", "bf16")
    """The `--dtype` values the format holds."""
    dtype_refusal: str = ""
    """Why the other dtypes cannot be written (said in the error)."""
    quantize: tuple[str, ...] = ()
    """The `--quantize` values the format holds (none: it takes no --quantize)."""

    def check(self, opts: ExportOptions) -> None:
        """Refuse a `--quantize` or `--dtype` this format cannot hold.

        Raises:
            OptionError: the message names the option, the format and what it takes instead.
        """
        from gptforge.errors import OptionError

        if opts.quantize is not None and opts.quantize not in self.quantize:
            offers = f"it offers {', '.join(self.quantize)}" if self.quantize else "it takes no --quantize"
            raise OptionError(f"--quantize {opts.quantize} cannot be written in the {self.name} format: {offers}")
        if opts.dtype is not None and opts.dtype not in self.dtypes:
            raise OptionError(f"--dtype {opts.dtype} cannot be written in the {self.name} format "
                             f"({self.dtype_refusal}): use {' or '.join(self.dtypes)}")


def tokenizer_dir(tokenizer: str | None) -> Path | None:
    """The folder of the `--tokenizer` option (a tokenizer.json or a folder), None when not given.

    Raises:
        MissingInputError: no such file or folder.
        InputError: a file other than tokenizer.json.
    """
    from gptforge.errors import InputError, MissingInputError

    if tokenizer is None:
        return None
    p = Path(tokenizer)
    if not p.exists():
        raise MissingInputError(f"--tokenizer {p}: no such file or folder")
    if p.is_file() and p.name != "tokenizer.json":
        raise InputError(f"--tokenizer {p}: expected a tokenizer.json or a folder of tokenizer files")
    return p if p.is_dir() else p.parent


def _torch_dtype(dtype: str | None) -> torch.dtype | None:
    from gptforge.export.common import DTYPES

    return DTYPES[dtype] if dtype else None


def _load(opts: ExportOptions, dtype: torch.dtype) -> tuple[GPT, dict]:
    """(model in `dtype`, sources with `tokenizer_dir` resolved from --tokenizer), with a progress bar."""
    from gptforge.export.common import load_source
    from gptforge.progress import progress

    with progress(f"loading {opts.source}", 1, "models") as bar:
        model, sources = load_source(opts.source, dtype)
        bar.advance()
    return model, dict(sources, tokenizer_dir=tokenizer_dir(opts.tokenizer) or sources["tokenizer_dir"])


def _write_hf(opts: ExportOptions, dtype_name: str | None) -> Path:
    """A gptforge run goes through `to_hf`, the code path of `convert --to-hf`; a Hugging Face
    folder is loaded and written again by the same writer (`save_hf`)."""
    from gptforge.progress import progress

    dtype = _torch_dtype(dtype_name)
    with progress("hf export: loading and writing safetensors", 1, "folders") as bar:
        src = Path(opts.source)
        if not (src / "config.json").is_file():
            from gptforge.runtime.loading import to_hf

            path = to_hf(src, Path(opts.out), dtype, Path(opts.tokenizer) if opts.tokenizer else None,
                         overwrite=opts.overwrite)
        else:
            from gptforge.export.common import load_source
            from gptforge.model.hf_save import save_hf

            model, sources = load_source(src, dtype)
            tok_dir = tokenizer_dir(opts.tokenizer) or sources["tokenizer_dir"]
            path = save_hf(model, model.config, opts.out, tokenizer_dir=tok_dir, base_config=sources["hf_config"],
                           generation_config=sources["generation_config"], dtype=dtype, overwrite=opts.overwrite)
        bar.advance()
    return path


def _say(kind: str, message: str) -> None:
    """One line on stderr, as generate prints its warnings."""
    print(f"gptforge export: {kind}: {message}", file=sys.stderr)


def _write_gguf(opts: ExportOptions, dtype_name: str | None) -> Path:
    """One .gguf file and an ollama Modelfile naming it, in the folder --out. The model is loaded
    in f32: the writer converts to the written dtype itself."""
    import torch

    from gptforge.atomic import staged_dir
    from gptforge.export.gguf import check_representable, gelu_note, gguf_filename, modelfile, write_gguf

    assert dtype_name is not None  # the format's default_dtype
    model, sources = _load(opts, torch.float32)
    check_representable(model.config, opts.approximate_gelu)  # before anything is written
    fname = gguf_filename(opts.name, dtype_name, opts.quantize)
    note = gelu_note(model.config, opts.approximate_gelu)
    if note:
        _say("note", note)
    with staged_dir(opts.out, opts.overwrite) as tmp:
        write_gguf(model, sources["tokenizer_dir"], tmp / fname, dtype=dtype_name, quantize=opts.quantize,
                   name=opts.name, approximate_gelu=opts.approximate_gelu,
                   warn=lambda message: _say("warning", message))
        (tmp / "Modelfile").write_text(modelfile(fname, model.config.block_size))
    return Path(opts.out) / fname


def _write_onnx(opts: ExportOptions, dtype_name: str | None) -> Path:
    """The model is traced in the dtype written."""
    from gptforge.export.onnx import export_onnx

    dtype = _torch_dtype(dtype_name)
    assert dtype is not None  # the format's default_dtype
    model, sources = _load(opts, dtype)
    return export_onnx(model, sources, opts.out, dtype, opts.quantize, opts.overwrite)


def _write_triton(opts: ExportOptions, dtype_name: str | None) -> Path:
    """The ONNX graph (traced in the dtype written) in a Triton model repository."""
    from gptforge.export.triton import export_triton

    dtype = _torch_dtype(dtype_name)
    assert dtype is not None  # the format's default_dtype
    model, sources = _load(opts, dtype)
    return export_triton(model, sources, opts.out, opts.name, dtype, opts.quantize, opts.overwrite,
                         opts.max_batch_size, opts.instances, opts.instance_kind)


_ONNX_DTYPE_REFUSAL = "onnxruntime's CPU kernels lack bfloat16"

FORMATS: dict[str, ExportFormat] = {
    "hf": ExportFormat("hf", _write_hf, default_dtype=None),
    "gguf": ExportFormat("gguf", _write_gguf, default_dtype="f16", quantize=("q8_0", "q4_0")),
    "onnx": ExportFormat("onnx", _write_onnx, default_dtype="f32", dtypes=("f32", "f16"),
                         dtype_refusal=_ONNX_DTYPE_REFUSAL, quantize=("int8",)),
    "triton": ExportFormat("triton", _write_triton, default_dtype="f32", dtypes=("f32", "f16"),
                           dtype_refusal=_ONNX_DTYPE_REFUSAL, quantize=("int8",)),
}
"""`--format` value -> its entry; the keys are the values `ExportOptions.format` takes."""


def export_model(opts: ExportOptions) -> Path:
    """Write `opts.source` in `opts.format` at `opts.out`; returns the path written (the folder,
    or the .gguf file inside it). Nothing is loaded or written before the options are checked.

    Raises:
        OptionError: an option the format cannot hold. InputError: `opts.out` exists without `overwrite`, or
            `opts.out` is the source or a folder above it (see `check_export_out`).
        MissingExtraError: a package of the `export` extra the format needs is not installed.
        MissingInputError: no source, or no tokenizer; and see each writer.
    """
    from gptforge.errors import require_extra
    from gptforge.export.common import check_export_out, format_packages, mark_export

    fmt = FORMATS[opts.format]
    fmt.check(opts)
    check_export_out(opts.source, opts.out, opts.overwrite, opts.tokenizer)
    require_extra(f"gptforge export --format {opts.format}", "export", format_packages(opts.format, opts.quantize))
    path = fmt.write(opts, opts.dtype or fmt.default_dtype)
    mark_export(opts.out)
    return path
