"""`gptforge export-checkpoint RUN_DIR_or_CHECKPOINT --out FILE`: one consolidated file from a
sharded (DCP) training checkpoint, on the CPU of one machine."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gptforge.atomic import default_mode, fsync_file
from gptforge.options import command_parser, parse_command

DESCRIPTION = """Write one consolidated model file from a training checkpoint, whatever layout and
number of ranks wrote it. Runs in one process on the CPU: it needs the model's size in RAM, not
the GPUs that trained it.

  --format safetensors (default): model weights only, full tensors, named as in the GPT module;
      the resolved model config is stored in the file's metadata (key gptforge_model_config).
  --format torch: everything in the checkpoint (model and optimizer states) as one torch.save
      file, through torch.distributed.checkpoint.format_utils.dcp_to_torch_save."""


@dataclass
class ExportCheckpointOptions:
    checkpoint: str
    """Run directory (checkpoints/latest, or best with --best) or a step folder."""
    out: str
    """Output file (.safetensors or .pt)."""
    format: Literal["safetensors", "torch"] = "safetensors"
    """safetensors: model weights; torch: model + optimizer, one torch.save file."""
    best: bool = False
    """Use checkpoints/best instead of latest."""
    overwrite: bool = False
    """Replace an existing --out file."""


def build_parser():
    return command_parser("gptforge export-checkpoint", DESCRIPTION, ExportCheckpointOptions,
                          positional=("checkpoint",))


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
            summary: dict[str, Any] = {"format": "torch"}
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
    args, _ = parse_command(build_parser(), argv)
    from gptforge.runtime.checkpoint import find_checkpoint

    if Path(args.out).exists() and not args.overwrite:
        raise FileExistsError(f"{args.out} exists; pass --overwrite to replace it")
    ckpt = find_checkpoint(args.checkpoint, "best" if args.best else "latest")
    summary = export(ckpt, Path(args.out), args.format)
    extra = f", {summary['tensors']} tensors, {summary['parameters']:,} values" if "tensors" in summary else ""
    print(f"wrote {args.out} from {ckpt} ({summary['format']}{extra}, {summary['bytes']:,} bytes)")
    return 0
