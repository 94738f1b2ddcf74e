"""One consolidated model file from a training checkpoint, whatever layout and number of ranks
wrote it, in one process on the CPU (`gptforge export-checkpoint` calls `export_checkpoint`; its
options are the fields of `ExportCheckpointOptions`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal


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


def write_consolidated(ckpt: Path, out: Path, fmt: str) -> dict:
    """Write checkpoint folder `ckpt` as one `fmt` file at `out`, atomically (a temporary sibling
    renamed into place); returns a summary: format and bytes, and for safetensors the number of
    tensors and parameters.

    safetensors: the model weights, full tensors named as in the GPT module, with the run's model
    config in the file's metadata (key gptforge_model_config). torch: everything in the
    checkpoint (model and optimizer states), through torch.distributed.checkpoint's
    `dcp_to_torch_save`.

    Raises:
        ValueError: the checkpoint holds no model tensors (safetensors).
    """
    import yaml

    from gptforge.atomic import default_mode, fsync_file

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


def export_checkpoint(opts: ExportCheckpointOptions) -> tuple[Path, dict]:
    """Find the checkpoint `opts` names and write it at `opts.out`: (checkpoint folder, the
    summary of `write_consolidated`).

    Raises:
        FileExistsError: `opts.out` exists without `overwrite` (checked before anything is read).
        FileNotFoundError, DamagedFileError: no checkpoint that verifies (see
            `runtime.checkpoint.find_checkpoint`).
        ValueError: the checkpoint holds no model tensors.
    """
    from gptforge.runtime.checkpoint import find_checkpoint

    if Path(opts.out).exists() and not opts.overwrite:
        raise FileExistsError(f"{opts.out} exists; pass --overwrite to replace it")
    ckpt = find_checkpoint(opts.checkpoint, "best" if opts.best else "latest")
    return ckpt, write_consolidated(ckpt, Path(opts.out), opts.format)
