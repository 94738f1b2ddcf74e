"""`gptforge convert`: Hugging Face model folders <-> gptforge checkpoints.

    gptforge convert --from-hf HF_DIR --out RUN_DIR     # HF folder -> gptforge run directory
    gptforge convert --to-hf CKPT --out HF_DIR          # run dir / checkpoint -> HF folder

A converted run directory is one that `pretrain` could have written: `config.yaml` (its `model`
section), `checkpoints/step_0000000/` (gptforge.runtime.checkpoint's format: DCP model state, trainer state,
config.yaml), `checkpoints/latest`, the tokenizer files, and the source's `hf_config.json` and
`generation_config.json` so that exporting it again gives the same Hugging Face folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

import torch

from gptforge.errors import OptionError
from gptforge.options import command_parser, parse_command

DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ConvertOptions:
    out: str
    """Folder to write (created atomically)."""
    from_hf: Optional[str] = None
    """Hugging Face model folder: config.json + model.safetensors (sharded too) or pytorch_model.bin,
    and tokenizer files."""
    to_hf: Optional[str] = None
    """gptforge run directory (uses checkpoints/latest), checkpoints folder, or one checkpoints/step_N folder."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weight dtype written: auto keeps the source's."""
    block_size: Optional[int] = None
    """--from-hf only: context length of the gptforge model (default the HF config's max_position_embeddings)."""
    tokenizer: Optional[str] = None
    """--to-hf only: tokenizer.json file or tokenizer folder (default: the one in the run directory)."""
    max_shard_size: float = 5.0
    """--to-hf only: largest safetensors shard, in GiB."""
    overwrite: bool = False
    """Replace --out if it exists."""


# One description: `gptforge --help` lists SUMMARY (read from this file unimported); DESCRIPTION begins with it.
SUMMARY = "Convert Hugging Face model folders (GPT-2, Llama, Mistral, Qwen2) to gptforge checkpoints and back."

DESCRIPTION = SUMMARY + ("\n\n--from-hf: a Hugging Face folder (GPT-2, Llama 2/3, Mistral, Qwen2) to a gptforge "
                         "checkpoint; --to-hf: a gptforge run or checkpoint to a Hugging Face folder that transformers "
                         "and vLLM load.")


def main(argv: list[str]) -> int:
    from gptforge.runtime.loading import from_hf, to_hf

    args, _ = parse_command(command_parser("gptforge convert", DESCRIPTION, ConvertOptions), argv)
    if (args.from_hf is None) == (args.to_hf is None):
        raise OptionError("give exactly one of --from-hf HF_DIR or --to-hf RUN_DIR")
    if args.from_hf is not None:
        if args.tokenizer is not None:
            raise OptionError("--tokenizer applies to --to-hf; --from-hf copies the HF folder's tokenizer")
        path = from_hf(Path(args.from_hf), Path(args.out), DTYPES[args.dtype], args.block_size, args.overwrite)
    else:
        if args.block_size is not None:
            raise OptionError("--block-size applies to --from-hf")
        path = to_hf(Path(args.to_hf), Path(args.out), DTYPES[args.dtype],
                     Path(args.tokenizer) if args.tokenizer else None, int(args.max_shard_size * 2**30), args.overwrite)
    print(f"wrote {path}")
    return 0
