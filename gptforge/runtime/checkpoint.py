"""Training checkpoints: torch.distributed.checkpoint (DCP) in every layout, single process too.

Layout of RUN_DIR/checkpoints/:
    step_000100/            one complete checkpoint
        .metadata, *.distcp  model + optimizer state (DCP, sharded by rank when distributed)
        trainer_state.pt     step, tokens seen, scheduler state, RNG states, data position
        config.yaml          the resolved config
    latest                  text file naming the newest complete step folder (written last)
    best                    likewise, for the best validation loss

A checkpoint is written to `.tmp_step_N/`, fsynced, then renamed to `step_N/`; the `latest`
pointer is replaced atomically afterwards. A kill at any instant therefore leaves `latest`
naming a complete checkpoint, and a half-written `.tmp_*` folder is never read.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from gptforge.atomic import atomic_write_text, fsync_dir

STATE_FILE = "trainer_state.pt"

# Optimizer states keyed per parameter name ("state.<fqn>.exp_avg", "param_groups.<fqn>.lr"), not
# by position in param_groups: each rank of a pipeline (or ZeRO-1 shard) saves the keys of the
# parameters it holds, and any other layout finds its own parameters' keys on load.
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


@contextlib.contextmanager
def quiet_single_process_dcp():
    """Silence DCP's warning that it runs without a process group (the normal single-process case)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        yield


def _dcp_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """{"model": ..., "optim": ...} in DCP's layout-independent form (optimizer state keyed by name)."""
    model_sd, optim_sd = get_state_dict(model, optimizer if optimizer is not None else [], options=_OPTIONS)
    state = {"model": model_sd}
    if optimizer is not None:
        state["optim"] = optim_sd
    return state


def _is_main() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU and CUDA generator states of this process."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def step_dir_name(step: int) -> str:
    return f"step_{step:07d}"


def save_checkpoint(ckpt_root: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                    trainer_state: dict[str, Any], config_yaml: str, keep: int = 2,
                    mark_best: bool = False, model_state: dict[str, Any] | None = None,
                    extra: Callable[[Path], None] | None = None) -> Path:
    """Write checkpoint `step` atomically under `ckpt_root` and point `latest` at it.

    Every rank calls this (DCP writes each rank's shards in parallel); rank 0 renames and writes
    the pointers. `trainer_state` holds plain Python/tensor values (step, tokens_seen, RNG, ...);
    in a distributed run each rank's RNG state is stored under its rank.
    Keeps the newest `keep` step folders plus the one `best` names.

    model_state: a ready model state dict to write instead of `get_state_dict(model)` (the
        DeepSpeed backend passes the full fp32 weights on rank 0 and {} on other ranks).
    extra: called on every rank with the temp folder after the DCP write, to add files that
        belong to the checkpoint (DeepSpeed's engine state); they are fsynced and become visible
        with the rest, at the rename.

    Returns: the final checkpoint folder.
    """
    ckpt_root = Path(ckpt_root)
    final = ckpt_root / step_dir_name(step)
    tmp = ckpt_root / f".tmp_{step_dir_name(step)}"
    rank = dist.get_rank() if dist.is_initialized() else 0
    if _is_main():
        ckpt_root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    _barrier()
    if model_state is not None:
        state = {"model": model_state}
    else:
        state = _dcp_state(model, optimizer)
    with quiet_single_process_dcp():
        dcp.save(state, checkpoint_id=str(tmp))
    if extra is not None:
        extra(tmp)
    # RNG states differ per rank; everything else is identical, so rank 0's copy is kept.
    rng = [None] * (dist.get_world_size() if dist.is_initialized() else 1)
    if dist.is_initialized():
        dist.all_gather_object(rng, rng_state())
    else:
        rng[0] = rng_state()
    if _is_main():
        payload = dict(trainer_state, rng_per_rank=rng)
        with open(tmp / STATE_FILE, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        atomic_write_text(tmp / "config.yaml", config_yaml)
        for p in sorted(tmp.rglob("*")):
            if p.is_file():
                with open(p, "rb") as f:
                    os.fsync(f.fileno())
            elif p.is_dir():
                fsync_dir(p)
        fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(ckpt_root)
        atomic_write_text(ckpt_root / "latest", final.name + "\n")
        if mark_best:
            atomic_write_text(ckpt_root / "best", final.name + "\n")
        _prune(ckpt_root, keep)
    del rank
    _barrier()
    return final


def _prune(ckpt_root: Path, keep: int) -> None:
    protected = {read_pointer(ckpt_root, "latest"), read_pointer(ckpt_root, "best")}
    steps = sorted(p for p in ckpt_root.glob("step_*") if p.is_dir())
    for p in steps[: max(0, len(steps) - keep)]:
        if p not in protected:
            shutil.rmtree(p, ignore_errors=True)


def read_pointer(ckpt_root: Path, name: str = "latest") -> Path | None:
    """The complete checkpoint folder that pointer `name` (latest/best) names, or None."""
    f = Path(ckpt_root) / name
    if not f.exists():
        return None
    target = Path(ckpt_root) / f.read_text().strip()
    if not is_complete(target):
        return None
    return target


def is_complete(path: Path) -> bool:
    """A checkpoint folder is complete when DCP's metadata and the trainer state both exist."""
    path = Path(path)
    return path.is_dir() and (path / ".metadata").exists() and (path / STATE_FILE).exists()


def find_checkpoint(path: str | Path, which: str = "latest") -> Path:
    """Resolve a run directory, a `checkpoints/` folder or a step folder to a complete checkpoint.

    Raises:
        FileNotFoundError: nothing complete is there; the message says what was looked at.
    """
    p = Path(path)
    if is_complete(p):
        return p
    for root in (p / "checkpoints", p):
        found = read_pointer(root, which)
        if found is not None:
            return found
        if which == "latest" and (root / "latest").exists():
            # The pointer names a damaged folder: fall back to the newest complete one.
            complete = [d for d in sorted(root.glob("step_*"), reverse=True) if is_complete(d)]
            if complete:
                return complete[0]
    raise FileNotFoundError(
        f"no complete checkpoint at {p}: expected a run directory with checkpoints/{which}, "
        "or a checkpoints/step_N folder holding .metadata and trainer_state.pt"
    )


def load_trainer_state(ckpt: Path) -> dict[str, Any]:
    return torch.load(Path(ckpt) / STATE_FILE, map_location="cpu", weights_only=False)


def load_checkpoint(ckpt: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """Load model (and optimizer) state from a DCP checkpoint into the live, possibly sharded,
    objects; restore this rank's RNG state. Works whatever layout wrote it (DCP reshards).
    `model` must name parameters as the GPT does (pass the unwrapped module or a pipeline
    stage); with ZeRO-1 pass the rank's local optimizer (`ZeroRedundancyOptimizer.optim`).

    Returns: the trainer state dict (step, tokens_seen, ...).

    Raises:
        InputError: the checkpoint is a quantized run's (`gptforge quantize`): not trainable.
    """
    ckpt = Path(ckpt)
    if (ckpt / "config.yaml").is_file():
        import yaml

        refuse_quantized(yaml.safe_load((ckpt / "config.yaml").read_text()) or {}, ckpt / "config.yaml")
    state = _dcp_state(model, optimizer)
    with quiet_single_process_dcp():
        dcp.load(state, checkpoint_id=str(ckpt))
    set_state_dict(
        model, optimizer if optimizer is not None else [],
        model_state_dict=state["model"], optim_state_dict=state.get("optim", {}),
        options=StateDictOptions(strict=True, flatten_optimizer_state_dict=True),
    )
    trainer_state = load_trainer_state(ckpt)
    restore_rng(trainer_state)
    return trainer_state


def refuse_quantized(doc: dict, where: Path) -> None:
    """Raise InputError when config dict `doc` (read from `where`) is a quantized run's: its weights
    are stored int8/int4/nf4 (see `gptforge.model.quant`) and can be loaded for inference only
    (`load_for_inference`), not trained, fine-tuned or converted."""
    q = doc.get("quantization")
    if q:
        from gptforge.errors import InputError

        raise InputError(
            f"{where}: this run is quantized ({q.get('method')}): its weights are for inference only "
            "(evaluate, generate); train, fine-tune or convert the original run it was quantized from"
        )


def restore_rng(trainer_state: dict[str, Any]) -> None:
    """Set this rank's RNG states from a trainer state (no-op when the saving run had fewer ranks)."""
    rngs = trainer_state.get("rng_per_rank") or []
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank < len(rngs) and rngs[rank] is not None:
        set_rng_state(rngs[rank])


def load_model_weights(ckpt: Path, model: torch.nn.Module) -> None:
    """Load only the model weights of a DCP checkpoint into `model` (for evaluate/generate)."""
    sd = model.state_dict()
    with quiet_single_process_dcp():
        dcp.load({"model": sd}, checkpoint_id=str(ckpt))
    model.load_state_dict(sd)


