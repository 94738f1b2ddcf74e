"""Write a model as an ordinary gptforge run directory (config.yaml, checkpoints/, tokenizer.json)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from gptforge.atomic import atomic_write_text
from gptforge.runtime.checkpoint import save_checkpoint


def write_run(model: torch.nn.Module, doc: dict, out: Path, tokenizer: Path | None, trainer_state: dict,
              extra_json: dict[str, dict] | None = None, overwrite: bool = False) -> Path:
    """Save `model` as a run directory at `out`: config.yaml (`doc` as YAML), a step-0
    checkpoint (weights only, no optimizer), a copy of `tokenizer` (a tokenizer.json) and
    `extra_json` ({file name: dict}). Built in a temp folder beside `out`, then moved in place.

    Raises:
        FileExistsError: `out` exists and not overwrite.
    """
    import yaml

    from gptforge.atomic import staged_dir

    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; choose another --out or pass --overwrite")
    with staged_dir(out, overwrite=True) as tmp:  # built beside `out`, moved in place when complete
        config_yaml = yaml.safe_dump(doc, sort_keys=False)
        save_checkpoint(tmp / "checkpoints", int(trainer_state.get("step", 0)), model, None, trainer_state,
                        config_yaml, keep=1)
        atomic_write_text(tmp / "config.yaml", config_yaml)
        if tokenizer is not None:
            shutil.copyfile(tokenizer, tmp / "tokenizer.json")
        for name, value in (extra_json or {}).items():
            atomic_write_text(tmp / name, json.dumps(value, indent=2) + "\n")
    return out
