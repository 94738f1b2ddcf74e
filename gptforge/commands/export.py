"""`gptforge export RUN_OR_HF_DIR --format hf|onnx|gguf|triton --out DIR`.

    gptforge export runs/tiny --format onnx --out exports/tiny-onnx
    gptforge export runs/tiny --format gguf --quantize q8_0 --out exports/tiny-gguf
    gptforge export runs/tiny --format triton --out exports/triton-repo
    gptforge export runs/tiny --format hf --out exports/tiny-hf    # the same as convert --to-hf

The options and each format's rules live in gptforge.export.formats (`ExportOptions`, `FORMATS`);
the writers in gptforge.export (ONNX, GGUF, Triton) and gptforge.model.hf_save (Hugging Face).
"""

from __future__ import annotations

from gptforge.export.formats import ExportOptions
from gptforge.options import command_parser, parse_command

# One description: `gptforge --help` lists SUMMARY (read from this file unimported); DESCRIPTION begins with it.
SUMMARY = "Export a run or Hugging Face folder as hf, onnx (KV cache), gguf (llama.cpp) or a Triton model repository."

DESCRIPTION = SUMMARY


def main(argv: list[str]) -> int:
    opts, _ = parse_command(command_parser("gptforge export", DESCRIPTION, ExportOptions, positional=("source",)),
                            argv)
    from gptforge.progress import set_quiet

    set_quiet(opts.quiet)
    from gptforge.export.formats import export_model

    print(f"wrote {export_model(opts)}")
    return 0
