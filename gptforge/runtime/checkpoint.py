"""Training checkpoints: torch.distributed.checkpoint (DCP) in every layout, single process too.

Layout of RUN_DIR/checkpoints/:
    step_000100/            one complete checkpoint
        .metadata, *.distcp  model + optimizer state (DCP, sharded by rank when distributed)
        model.safetensors    the model weights again, whole, when they are whole on rank 0
                             (single process, DDP): read by inference without DCP (see below)
        trainer_state.pt     step, tokens seen, scheduler state, RNG states, data position
        trainer_state.sha256 SHA-256 of trainer_state.pt (hex), written at save
        config.yaml          the resolved config
    latest                  text file naming the newest complete step folder (written last)
    best                    likewise, for the best validation loss

A checkpoint is written to `.tmp_step_N/`, fsynced, then renamed to `step_N/`; the `latest`
pointer is replaced atomically afterwards. A kill at any instant therefore leaves `latest`
naming a complete checkpoint, and a half-written `.tmp_*` folder is never read.

Choosing a checkpoint (`find_checkpoint`) verifies it (`verify_checkpoint`: every DCP data file
as long as `.metadata` says, trainer_state.pt matching its checksum) and falls back, with a
warning, to the newest intact step folder when `latest` is missing, names a missing folder or
names a damaged one (a disk that filled up, a copy cut short). An intact step folder newer than
the one `latest` names is chosen over it (a kill between the rename and the pointer update).
A run that continues from step N (resume, spike rollback) deletes the step folders newer than
N (`discard_newer`), so that no folder of an abandoned history is kept or chosen later.

The consolidated `model.safetensors` exists so that `generate`/`evaluate` start fast: importing
`torch.distributed.checkpoint` pulls in DTensor and sympy (0.7-1.4 s), while safetensors costs
milliseconds. It is written in the same temp folder, so it appears with the rest at the rename;
its metadata names the step and the SHA-256 of the trainer_state.pt written beside it, which
binds it to this checkpoint. By default it is written only when cheap: when the optimizer
state is at least as large as the weights (full training: +33% disk with AdamW), not beside
weights alone or a LoRA run's tiny optimizer state, where it would double the folder. It is
skipped when the weights are not whole on rank 0 (FSDP, tensor or pipeline parallel: DTensors
or different tensors per rank; DeepSpeed's other ranks) or not plain tensors (QLoRA's 4-bit
base). Readers that want weights only (`find_checkpoint(..., weights_only=True)`,
`load_model_weights`, `runtime.loading`) use it when `consolidated_problem` finds nothing
wrong, and DCP otherwise; training resumes always read DCP.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import random
import shutil
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from gptforge.atomic import atomic_write_text, file_sha256, fsync_dir
from gptforge.runtime.consolidated import (  # noqa: F401  (re-exported: part of this module's API)
    CONSOLIDATED_FILE,
    CONSOLIDATED_FORMAT,
    STATE_FILE,
    consolidated_problem,
    read_consolidated,
    tensor_bytes,
    whole_signature,
    write_consolidated,
)

# torch.distributed.checkpoint is imported inside the functions that use it: it costs 0.7-1.4 s
# of start-up (DTensor, sympy), which inference from a consolidated file does without.

STATE_CHECKSUM_FILE = "trainer_state.sha256"

log = logging.getLogger("gptforge")


def _options(**kw):
    # Optimizer states keyed per parameter name ("state.<fqn>.exp_avg", "param_groups.<fqn>.lr"),
    # not by position in param_groups: each rank of a pipeline (or ZeRO-1 shard) saves the keys of
    # the parameters it holds, and any other layout finds its own parameters' keys on load.
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True, **kw)


@contextlib.contextmanager
def quiet_single_process_dcp():
    """Silence DCP's warning that it runs without a process group (the normal single-process case)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        yield


@contextlib.contextmanager
def _without_empty_groups(optimizer: torch.optim.Optimizer | None):
    """Hide `optimizer`'s parameter groups that hold no parameter for the duration of the block,
    then put them back at their places (after the groups that a `load_state_dict` inside the
    block installed).

    A ZeRO-1 rank's local optimizer gets such groups (`ZeroRedundancyOptimizer` splits each group
    over the ranks by size, and a small group may give a rank nothing); torch's flattened
    optimizer state dict names a group's hyperparameters after its first parameter, so DCP's
    `set_state_dict` fails on an empty one (IndexError in `_unflatten_optim_state_dict`). An empty
    group has no state to save, and its hyperparameters are those of the run's config (ZeRO-1
    copies them from its own groups before every step), so hiding it loses nothing.
    """
    if optimizer is None or all(g["params"] for g in optimizer.param_groups):
        yield
        return
    empty = [(i, g) for i, g in enumerate(optimizer.param_groups) if not g["params"]]
    optimizer.param_groups = [g for g in optimizer.param_groups if g["params"]]
    try:
        yield
    finally:
        groups = list(optimizer.param_groups)
        for i, g in empty:
            groups.insert(i, g)
        optimizer.param_groups = groups


def _dcp_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """{"model": ..., "optim": ...} in DCP's layout-independent form (optimizer state keyed by
    name). Call it inside `_without_empty_groups(optimizer)`."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer if optimizer is not None else [], options=_options())
    state: dict[str, Any] = {"model": model_sd}
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


def _step_number(folder: Path) -> int:
    """N of a `step_N` folder; -1 for a name that is not one."""
    try:
        return int(Path(folder).name.removeprefix("step_"))
    except ValueError:
        return -1


def save_checkpoint(ckpt_root: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                    trainer_state: dict[str, Any], config_yaml: str, keep: int = 2,
                    mark_best: bool = False, model_state: dict[str, Any] | None = None,
                    extra: Callable[[Path], None] | None = None, consolidated: bool | None = None) -> Path:
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
    consolidated: also write the model weights as `model.safetensors` when rank 0 holds them
        whole (every rank's weights have the same names and shapes, none is a DTensor, all are
        plain tensors); see the module docstring. Costs one more copy of the weights on disk:
        about a third more for a checkpoint with AdamW states, twice for weights alone. None
        (default): only when that is cheap, the optimizer state (all ranks together) at least
        as large as the weights, so the folder grows by at most a half: full training with
        AdamW or Muon, not LoRA (a tiny optimizer state) nor the weights-only checkpoints of
        convert, quantize or prune. True: whenever the weights are whole; False: never.

    Returns: the final checkpoint folder.
    """
    ckpt_root = Path(ckpt_root)
    final = ckpt_root / step_dir_name(step)
    tmp = ckpt_root / f".tmp_{step_dir_name(step)}"
    if _is_main():
        ckpt_root.mkdir(parents=True, exist_ok=True)
        remove_partial_files(ckpt_root)
        tmp.mkdir()
    _barrier()
    try:
        saved = _write_checkpoint(tmp, model, optimizer, model_state, extra)
    except BaseException:
        # A failed write (disk full, Ctrl-C) must not leave a half checkpoint filling the disk.
        if _is_main():
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    rng, whole = _gather_rank_facts(saved, consolidated)
    if _is_main():
        _publish(tmp, final, dict(trainer_state, rng_per_rank=rng), config_yaml,
                 saved["model"] if whole else None, step)
        if mark_best:
            atomic_write_text(ckpt_root / "best", final.name + "\n")
        _prune(ckpt_root, keep)
    _barrier()
    return final


def _gather_rank_facts(saved: dict[str, Any], consolidated: bool | None) -> tuple[list, bool]:
    """(every rank's RNG state, whether to write the consolidated weights) after the DCP write.

    RNG states differ per rank; everything else is identical, so rank 0's copy is kept. The
    weights' signature rides along: equal on every rank means rank 0 holds them all (DDP); and
    the optimizer state's bytes, to judge whether one more copy of the weights is cheap.
    """
    model_sd = saved["model"]
    signature = whole_signature(model_sd) if consolidated is not False else None
    mine = (rng_state(), signature, tensor_bytes(saved.get("optim", {})))
    gathered: list[Any] = [None] * (dist.get_world_size() if dist.is_initialized() else 1)
    if dist.is_initialized():
        dist.all_gather_object(gathered, mine)
    else:
        gathered[0] = mine
    rng = [g[0] for g in gathered]
    whole = signature is not None and all(g[1] == signature for g in gathered)
    if whole and consolidated is None:  # cheap: at most half again the DCP data
        whole = sum(g[2] for g in gathered) >= tensor_bytes(model_sd)
    return rng, whole


def _publish(tmp: Path, final: Path, payload: dict[str, Any], config_yaml: str,
             consolidated_sd: dict[str, Any] | None, step: int) -> None:
    """Rank 0: write trainer_state.pt, its checksum, config.yaml (and the consolidated weights when
    given) into `tmp`, fsync every file and folder, rename `tmp` to `final` and point `latest` at it."""
    with open(tmp / STATE_FILE, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    state_sha = file_sha256(tmp / STATE_FILE)
    atomic_write_text(tmp / STATE_CHECKSUM_FILE, state_sha + "\n")
    atomic_write_text(tmp / "config.yaml", config_yaml)
    if consolidated_sd is not None:
        try:
            write_consolidated(tmp / CONSOLIDATED_FILE, consolidated_sd, step, state_sha)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
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
    fsync_dir(final.parent)
    atomic_write_text(final.parent / "latest", final.name + "\n")


def _write_checkpoint(tmp: Path, model, optimizer, model_state, extra) -> dict[str, Any]:
    """DCP-save model (+ optimizer) into `tmp`; returns what was saved ({"model": ..., "optim": ...})."""
    import torch.distributed.checkpoint as dcp

    if model_state is not None:
        state = {"model": model_state}
    else:
        with _without_empty_groups(optimizer):
            state = _dcp_state(model, optimizer)
    with quiet_single_process_dcp():
        dcp.save(state, checkpoint_id=str(tmp))
    if extra is not None:
        extra(tmp)
    return state


def remove_partial_files(ckpt_root: Path) -> list[Path]:
    """Delete what dead writers left in `ckpt_root`: `.tmp_step_*` folders and `.NAME.XXXX.tmp` files.

    Only the run's single writer may call this (the run folder's lock, `runtime.lock`, makes it
    so), before it writes. Returns what was removed.
    """
    removed = []
    for p in Path(ckpt_root).glob(".tmp_step_*"):
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    for p in Path(ckpt_root).glob(".*.tmp"):
        if p.is_file():
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def discard_newer(ckpt_root: str | Path, step: int) -> list[Path]:
    """Delete the step folders of `ckpt_root` newer than `step`: they belong to a history the run
    left (resumed from, or rolled back to, checkpoint `step`), so neither rotation nor a later
    `find_checkpoint` may keep or choose them. Pointers naming a deleted folder are deleted too.
    Only the run's single writer (rank 0, holding the run lock) may call this. Returns what was
    removed (each logged as a warning)."""
    ckpt_root = Path(ckpt_root)
    removed = []
    for d in sorted(ckpt_root.glob("step_*")):
        if d.is_dir() and _step_number(d) > step:
            log.warning(f"{ckpt_root}: removing {d.name}, newer than the step {step} this run continues "
                        f"from (it belongs to the abandoned history)")
            shutil.rmtree(d)
            removed.append(d)
    for name in ("latest", "best"):
        f = ckpt_root / name
        if removed and f.is_file() and ckpt_root / f.read_text().strip() in removed:
            f.unlink()
    return removed


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




def verify_checkpoint(path: str | Path, weights_only: bool = False) -> str | None:
    """What is wrong with checkpoint folder `path`, or None when it is intact.

    Checks, without loading any tensor: `.metadata` and trainer_state.pt exist; `.metadata`
    reads; every data file it names exists and is at least as long as the last byte range
    DCP recorded in it; trainer_state.pt matches trainer_state.sha256 (checkpoints written
    before the checksum existed skip that check). Costs a stat per file and one read of
    trainer_state.pt (kilobytes to a few MB).

    weights_only: for readers of the model weights alone: when the consolidated
        model.safetensors is sound (`consolidated_problem`), the DCP files are not examined
        (and torch.distributed.checkpoint is not imported); otherwise as above.
    """
    path = Path(path)
    if not path.is_dir():
        return "the folder does not exist"
    for name in (".metadata", STATE_FILE):
        if not (path / name).is_file():
            return f"{name} is missing"
    if weights_only and (path / CONSOLIDATED_FILE).is_file() and consolidated_problem(path) is None:
        return None  # an unsound one is ignored here; `read_consolidated` warns when a loader skips it
    import torch.distributed.checkpoint as dcp

    try:
        metadata = dcp.FileSystemReader(str(path)).read_metadata()
    except (OSError, EOFError, ValueError, RuntimeError, pickle.UnpicklingError) as e:  # a cut-off pickle
        return f".metadata does not read ({type(e).__name__}: {e})"
    ends: dict[str, int] = {}
    for info in getattr(metadata, "storage_data", {}).values():
        rel = getattr(info, "relative_path", None)
        if rel is not None:
            ends[rel] = max(ends.get(rel, 0), int(info.offset) + int(info.length))
    for rel, end in sorted(ends.items()):
        f = path / rel
        if not f.is_file():
            return f"{rel} is missing"
        size = f.stat().st_size
        if size < end:
            return f"{rel} is {size:,} bytes, shorter than the {end:,} bytes .metadata records (truncated)"
    checksum = path / STATE_CHECKSUM_FILE
    if checksum.is_file():
        want = checksum.read_text().strip()
        if file_sha256(path / STATE_FILE) != want:
            return f"{STATE_FILE} does not match its checksum in {STATE_CHECKSUM_FILE} (changed or damaged)"
    return None


def find_checkpoint(path: str | Path, which: str = "latest", weights_only: bool = False) -> Path:
    """Resolve a run directory, a `checkpoints/` folder or a step folder to an intact checkpoint.

    A step folder is returned when it verifies (`verify_checkpoint`, given `weights_only`: True
    for readers of the model weights alone, which then accept a checkpoint by its sound
    model.safetensors without importing torch.distributed.checkpoint). Under a run directory or
    `checkpoints/`, pointer `which` (latest/best) is followed; when it is missing, names a
    missing or incomplete folder, or names a damaged one, the newest intact `step_*` folder is
    used instead; for `latest`, an intact step folder newer than the one it names wins too, with a warning naming what was skipped and why (for `best`, only when the
    pointer exists). Every rank of a distributed run sees the same files, so all choose alike.

    Raises:
        DamagedFileError: checkpoints exist but none verifies (the message names each problem).
        FileNotFoundError: nothing complete is there; the message says what was looked at.
    """
    from gptforge.errors import DamagedFileError

    p = Path(path)
    if (p / ".metadata").exists() or (p / STATE_FILE).exists():
        problem = verify_checkpoint(p, weights_only)
        if problem is None:
            return p
        raise DamagedFileError(f"checkpoint {p} is damaged: {problem}; use an earlier step folder or the run "
                               f"directory (which falls back to the newest intact checkpoint)")
    for root in (p / "checkpoints", p):
        pointer = root / which
        steps = sorted((d for d in root.glob("step_*") if d.is_dir()), reverse=True)
        if not pointer.exists() and not (which == "latest" and steps):
            continue
        skipped: list[str] = []
        named = None
        if pointer.exists():
            named = root / pointer.read_text().strip()
            if which == "latest":
                # `latest` is written after its folder's rename: a complete, intact step folder newer
                # than the one it names is a later state of the same run (killed between the two).
                for d in steps:
                    if _step_number(d) <= _step_number(named):
                        break
                    if verify_checkpoint(d, weights_only) is None:
                        log.warning(f"{root}: {d.name} is complete and newer than {named.name}, which `latest` "
                                    f"names (the run stopped before updating it); using {d.name}")
                        return d
            problem = verify_checkpoint(named, weights_only)
            if problem is None:
                return named
            skipped.append(f"{named.name} ({problem})")
        elif steps:
            skipped.append(f"{pointer} is missing")
        for d in steps:
            if d == named:
                continue
            problem = verify_checkpoint(d, weights_only)
            if problem is None:
                log.warning(f"{root}: {'; '.join(skipped)}: damaged or incomplete; using the previous intact "
                            f"checkpoint {d.name}")
                return d
            skipped.append(f"{d.name} ({problem})")
        if skipped and any(verify_checkpoint(d, weights_only) is not None
                           for d in steps if (d / ".metadata").exists()):
            raise DamagedFileError(f"no intact checkpoint under {root}: {'; '.join(skipped)}; start the run "
                                   f"again with a new --out (this folder keeps the damaged files to look at) or "
                                   f"restore them from a copy")
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
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    with _without_empty_groups(optimizer):
        state = _dcp_state(model, optimizer)
        with quiet_single_process_dcp():
            dcp.load(state, checkpoint_id=str(ckpt))
        set_state_dict(
            model, optimizer if optimizer is not None else [],
            model_state_dict=state["model"], optim_state_dict=state.get("optim", {}),
            options=_options(strict=True),
        )
    trainer_state = load_trainer_state(ckpt)
    restore_rng(trainer_state)
    return trainer_state


def refuse_quantized(doc: dict, where: Path) -> None:
    """Raise InputError when config dict `doc` (read from `where`) is a quantized run's: its weights
    are stored int8/int4/nf4 (see `gptforge.model.quant`) and can be loaded for inference only
    (`load_for_inference`), not trained, fine-tuned, converted or exported."""
    q = doc.get("quantization")
    if q:
        from gptforge.errors import InputError

        method = (q.get("spec") or {}).get("method")
        source = f" ({q['source']})" if q.get("source") else ""
        raise InputError(
            f"{where}: this run is quantized ({method}): its weights are for inference only (evaluate, generate, "
            f"serve); train, fine-tune, convert or export the original run it was quantized from{source} "
            "(`gptforge export --quantize` writes quantized GGUF/ONNX from it)"
        )


def restore_rng(trainer_state: dict[str, Any]) -> None:
    """Set this rank's RNG states from a trainer state (no-op when the saving run had fewer ranks)."""
    rngs = trainer_state.get("rng_per_rank") or []
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank < len(rngs) and rngs[rank] is not None:
        set_rng_state(rngs[rank])


def load_model_weights(ckpt: Path, model: torch.nn.Module) -> None:
    """Load only the model weights of a checkpoint into `model` (for evaluate/generate).

    From the consolidated model.safetensors when it is sound and holds exactly `model`'s tensor
    names, else from the DCP files.

    Raises:
        DamagedFileError: a consolidated tensor's shape differs from the model's.
    """
    sd = model.state_dict()
    header = read_consolidated(ckpt)
    if header is not None and set(header.names) == set(sd):
        header.fill(sd)
    else:
        import torch.distributed.checkpoint as dcp

        with quiet_single_process_dcp():
            dcp.load({"model": sd}, checkpoint_id=str(ckpt))
    model.load_state_dict(sd)


