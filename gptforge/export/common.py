"""What every export writer shares: loading the source model and the tokenizer files.

- `load_source(path, dtype)`: a gptforge run / checkpoint (LoRA merged) or a Hugging Face folder
  -> (GPT in eval mode, sources), through `gptforge.runtime.loading.load_pretrained`.
- `tokenizer_files(tokenizer_dir, block_size)`: the tokenizer files written beside an exported
  model, as the Hugging Face writer writes them.

Every writer builds its output folder inside `gptforge.atomic.staged_dir`, a temporary sibling
folder renamed onto `out` only when the writer finished, so an interrupted export never leaves a
folder that looks complete.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gptforge.errors import InputError, MissingInputError

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
"""`--dtype` spellings of the export command -> torch dtypes."""


def format_packages(fmt: str, quantize: str | None = None) -> dict[str, str]:
    """The packages of the `export` extra that writing `fmt` imports: {module: pip package}.

    onnx / triton: onnx and onnxscript (torch's ONNX exporter), onnxruntime for --quantize int8;
    gguf: gguf (llama.cpp's writer); hf: none (safetensors is a core dependency).
    """
    if fmt in ("onnx", "triton"):
        out = {"onnx": "onnx", "onnxscript": "onnxscript"}
        if quantize:
            out["onnxruntime"] = "onnxruntime"
        return out
    return {"gguf": "gguf"} if fmt == "gguf" else {}


def check_export_out(source: str | Path, out: str | Path, overwrite: bool,
                     tokenizer: str | Path | None = None) -> None:
    """Refuse an export before anything is loaded or written when replacing `out` would be wrong:
    `out` exists without `overwrite`, `out` is a file or a non-empty folder without EXPORT_MARKER
    (a folder gptforge export did not write), or `out` is the source (run, checkpoint or Hugging Face
    folder) or a folder above it, or above `tokenizer` (`--overwrite` would delete them).

    Raises:
        InputError: the message names --out and what to do.
    """
    from gptforge.atomic import check_not_inside

    check_not_inside(out, [source, *([tokenizer] if tokenizer else [])])
    out = Path(out)
    if out.exists() and not overwrite:
        raise InputError(f"{out} exists; choose another --out or pass --overwrite")
    if out.is_file() or (out.is_dir() and any(out.iterdir()) and not (out / EXPORT_MARKER).is_file()):
        raise InputError(f"--out {out} exists and was not written by gptforge export (no {EXPORT_MARKER} in it); "
                         f"--overwrite replaces only an export's own folder: choose another --out, or remove it "
                         f"yourself")


#: the file every `gptforge export` folder holds: the mark of a folder --overwrite may replace.
EXPORT_MARKER = ".gptforge-export"


def mark_export(out: str | Path) -> None:
    """Write EXPORT_MARKER into the export folder `out` (after the export is in place)."""
    from gptforge.atomic import atomic_write_text

    atomic_write_text(Path(out) / EXPORT_MARKER, "written by gptforge export; `gptforge export --overwrite` may "
                                                 "replace this folder\n")


def dtype_name(dtype: torch.dtype) -> str:
    """The `--dtype` spelling of a torch dtype (f32, f16, bf16)."""
    return {v: k for k, v in DTYPES.items()}[dtype]


def load_source(path: str | Path, dtype: torch.dtype | None = None):
    """(model, sources) to export from `path`: a run directory, a checkpoint folder or a Hugging
    Face folder.

    The model is a plain `GPT` in eval mode on the CPU (a LoRA / QLoRA fine-tune merged, see
    `load_model_checkpoint`), cast to `dtype` when given. `sources` is `load_pretrained`'s dict:
    `tokenizer_dir`, `hf_config`, `generation_config`.

    Raises:
        MissingInputError: nothing loadable at `path` (the message says what was looked for).
        InputError: a checkpoint without model weights, an unsupported Hugging Face config, or a
            QLoRA run without bitsandbytes to dequantize its base.
    """
    from gptforge.model.qlora import QLoRAUnavailable
    from gptforge.runtime.loading import load_pretrained

    path = Path(path)
    if not path.exists():
        raise MissingInputError(f"{path}: no such run directory, checkpoint or Hugging Face folder")
    try:
        model, sources = load_pretrained(path, dtype)
    except FileNotFoundError as e:
        raise MissingInputError(str(e)) from None
    except (ValueError, QLoRAUnavailable) as e:
        raise InputError(str(e)) from None
    model.eval()
    if dtype is not None:
        model.to(dtype)
        model.reset_rope()
    return model, sources


def tokenizer_files(tokenizer_dir: Path | None, block_size: int) -> dict[str, bytes]:
    """{file name: bytes} of the tokenizer files to write beside an exported model.

    Hugging Face tokenizer files in `tokenizer_dir` (see `gptforge.model.hf_save.TOKENIZER_FILES`)
    are copied as they are; a bare tokenizer.json (gptforge's own) gets the tokenizer_config.json
    and special_tokens_map.json `save_hf` writes for it, so `AutoTokenizer.from_pretrained` loads
    the folder; a chat_template.jinja is also written into tokenizer_config.json
    (`carry_chat_template`).

    Raises:
        MissingInputError: no tokenizer_dir, or no tokenizer files in it.
    """
    import json

    from gptforge.model.hf_save import TOKENIZER_FILES, bare_tokenizer_config, carry_chat_template

    if tokenizer_dir is None:
        raise MissingInputError("no tokenizer in the checkpoint, its run directory or its data folder; "
                                "copy the tokenizer.json the run was trained with into the run directory")
    tokenizer_dir = Path(tokenizer_dir)
    files = {n: (tokenizer_dir / n).read_bytes() for n in TOKENIZER_FILES if (tokenizer_dir / n).is_file()}
    if not files:
        raise MissingInputError(f"{tokenizer_dir}: no tokenizer files ({', '.join(TOKENIZER_FILES[:4])}, ...)")
    if "tokenizer.json" in files and "tokenizer_config.json" not in files:
        try:
            cfg, smap = bare_tokenizer_config(tokenizer_dir / "tokenizer.json", block_size)
        except ValueError as e:
            raise InputError(str(e)) from None
        files["tokenizer_config.json"] = (json.dumps(cfg, indent=2, sort_keys=True) + "\n").encode()
        files["special_tokens_map.json"] = (json.dumps(smap, indent=2, sort_keys=True) + "\n").encode()
    return carry_chat_template(files)


