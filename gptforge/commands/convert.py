"""`gptforge convert`: Hugging Face model folders <-> gptforge checkpoints.

    gptforge convert --from-hf HF_DIR --out RUN_DIR     # HF folder -> gptforge run directory
    gptforge convert --to-hf CKPT --out HF_DIR          # run dir / checkpoint -> HF folder

A converted run directory is one that `pretrain` could have written: `config.yaml` (its `model`
section), `checkpoints/step_0000000/` (gptforge.runtime.checkpoint's format: DCP model state, trainer state,
config.yaml), `checkpoints/latest`, the tokenizer files, and the source's `hf_config.json` and
`generation_config.json` so that exporting it again gives the same Hugging Face folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gptforge convert",
        description="Convert a Hugging Face model folder (GPT-2, Llama 2/3, Mistral, Qwen2) to a gptforge "
        "checkpoint, or a gptforge run/checkpoint to a Hugging Face folder that transformers and vLLM load.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-hf", metavar="HF_DIR", type=Path,
                     help="Hugging Face model folder: config.json + model.safetensors (sharded too) or pytorch_model.bin, and tokenizer files.")
    src.add_argument("--to-hf", metavar="CKPT", type=Path,
                     help="gptforge run directory (uses checkpoints/latest), checkpoints folder, or one checkpoints/step_N folder.")
    p.add_argument("--out", required=True, type=Path, help="Folder to write (created atomically).")
    p.add_argument("--dtype", choices=list(DTYPES), default="auto",
                   help="Weight dtype written: auto keeps the source's (default auto).")
    p.add_argument("--block-size", type=int, default=None,
                   help="--from-hf only: context length of the gptforge model (default the HF config's max_position_embeddings).")
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="--to-hf only: tokenizer.json file or tokenizer folder (default: the one in the run directory).")
    p.add_argument("--max-shard-size", type=float, default=5.0,
                   help="--to-hf only: largest safetensors shard, in GiB (default 5).")
    p.add_argument("--overwrite", action="store_true", help="Replace --out if it exists.")
    return p


def main(argv: list[str]) -> int:
    from gptforge.model.qlora import QLoRAUnavailable
    from gptforge.runtime.loading import from_hf, to_hf

    args = _parser().parse_args(argv)
    try:
        if args.from_hf is not None:
            if args.tokenizer is not None:
                raise ValueError("--tokenizer applies to --to-hf; --from-hf copies the HF folder's tokenizer")
            path = from_hf(args.from_hf, args.out, DTYPES[args.dtype], args.block_size, args.overwrite)
        else:
            if args.block_size is not None:
                raise ValueError("--block-size applies to --from-hf")
            path = to_hf(args.to_hf, args.out, DTYPES[args.dtype], args.tokenizer,
                         int(args.max_shard_size * 2**30), args.overwrite)
    except (FileNotFoundError, FileExistsError, ValueError, QLoRAUnavailable) as e:
        print(f"gptforge convert: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0
