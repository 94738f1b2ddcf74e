"""`gptforge export-checkpoint RUN_DIR_or_CHECKPOINT --out FILE`: one consolidated file from a
sharded (DCP) training checkpoint, on the CPU of one machine."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from gptforge.atomic import default_mode, fsync_file

DESCRIPTION = """Write one consolidated model file from a training checkpoint, whatever layout and
number of ranks wrote it. Runs in one process on the CPU: it needs the model's size in RAM, not
the GPUs that trained it.

  --format safetensors (default): model weights only, full tensors, named as in the GPT module;
      the resolved model config is stored in the file's metadata (key gptforge_model_config).
  --format torch: everything in the checkpoint (model and optimizer states) as one torch.save
      file, through torch.distributed.checkpoint.format_utils.dcp_to_torch_save."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gptforge export-checkpoint", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="Run directory (checkpoints/latest, or best with --best) or a step folder.")
    p.add_argument("--out", required=True, help="Output file (.safetensors or .pt).")
    p.add_argument("--format", choices=("safetensors", "torch"), default="safetensors",
                   help="safetensors: model weights (default); torch: model + optimizer, one torch.save file.")
    p.add_argument("--best", action="store_true", help="Use checkpoints/best instead of latest.")
    p.add_argument("--overwrite", action="store_true", help="Replace an existing --out file.")
    return p


def consolidated_model_state(ckpt: Path) -> dict:
    """Full (unsharded) model tensors of a DCP checkpoint, on the CPU: {name: tensor}.

    Shapes and dtypes come from the checkpoint's metadata; DCP reads every shard into place.

    Raises:
        ValueError: the checkpoint holds no model tensors.
    """
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from gptforge.runtime.checkpoint import quiet_single_process_dcp

    md = dcp.FileSystemReader(str(ckpt)).read_metadata()
    model = {}
    for key, meta in md.state_dict_metadata.items():
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata):
            model[key[len("model."):]] = torch.empty(meta.size, dtype=meta.properties.dtype)
    if not model:
        raise ValueError(f"{ckpt} holds no model tensors (expected keys model.*)")
    state = {"model": model}
    with quiet_single_process_dcp():
        dcp.load(state, checkpoint_id=str(ckpt), no_dist=True)
    return state["model"]


def _tmp_for(out: Path) -> Path:
    return out.with_name(f".{out.name}.tmp{os.getpid()}")


def export(ckpt: Path, out: Path, fmt: str) -> dict:
    """Write `out` atomically; returns a summary (tensors, parameters, bytes)."""
    import yaml

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_for(out)
    try:
        if fmt == "torch":
            from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

            dcp_to_torch_save(str(ckpt), str(tmp))
            summary = {"format": "torch"}
        else:
            from safetensors.torch import save_file

            tensors = {k: v.contiguous() for k, v in consolidated_model_state(ckpt).items()}
            doc = yaml.safe_load((ckpt / "config.yaml").read_text()) if (ckpt / "config.yaml").exists() else {}
            meta = {"format": "pt", "gptforge_model_config": json.dumps(doc.get("model", {})),
                    "gptforge_checkpoint": ckpt.name}
            save_file(tensors, str(tmp), metadata=meta)
            summary = {"format": "safetensors", "tensors": len(tensors),
                       "parameters": sum(t.numel() for t in tensors.values())}
        default_mode(tmp)
        fsync_file(tmp)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    summary["bytes"] = out.stat().st_size
    return summary


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from gptforge.runtime.checkpoint import find_checkpoint

    try:
        if Path(args.out).exists() and not args.overwrite:
            raise FileExistsError(f"{args.out} exists; pass --overwrite to replace it")
        ckpt = find_checkpoint(args.checkpoint, "best" if args.best else "latest")
        summary = export(ckpt, Path(args.out), args.format)
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"gptforge export-checkpoint: error: {e}", file=sys.stderr)
        return 1
    extra = f", {summary['tensors']} tensors, {summary['parameters']:,} values" if "tensors" in summary else ""
    print(f"wrote {args.out} from {ckpt} ({summary['format']}{extra}, {summary['bytes']:,} bytes)")
    return 0
