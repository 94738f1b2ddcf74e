"""Resuming a run: the saved config put under the user's options."""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml


def out_dir_of(argv: list[str]) -> str | None:
    """The value of `--out DIR` / `--out=DIR` in a command line, or None."""
    for i, a in enumerate(argv):
        if a == "--out" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--out="):
            return a.split("=", 1)[1]
    return None


def resume_auto_argv(argv: list[str], prog: str) -> list[str]:
    """`argv` with `--resume auto` (or `--resume=auto`) decided: `--resume` when the --out folder
    holds a run (its config.yaml), dropped otherwise, so one command line starts a run and, run
    again (a scheduler's requeue, torchrun's --max-restarts), continues it from its newest
    complete checkpoint. A run folder whose first checkpoint never completed is resumed too: the
    trainer then starts it fresh (see `nothing_to_resume`).

    Every rank decides before the process group forms, hence before rank 0 writes anything into
    the folder, so all ranks decide alike. Prints the decision once (on rank 0) with `prog`.
    Returns argv unchanged when it has no `--resume auto`.
    """
    import os

    for i, a in enumerate(argv):
        if a == "--resume" and i + 1 < len(argv) and argv[i + 1] == "auto":
            rest = argv[:i] + argv[i + 2:]
            break
        if a == "--resume=auto":
            rest = argv[:i] + argv[i + 1:]
            break
    else:
        return argv
    out = out_dir_of(rest)
    holds_run = out is not None and (Path(out) / "config.yaml").is_file()
    if os.environ.get("RANK", "0") == "0":
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        after = f" (torchrun restart {restart})" if restart != "0" else ""
        print(f"{prog}: --resume auto{after}: " + (f"{out} holds a run: resuming it" if holds_run else
                                                  f"no run in {out} yet: starting one"), flush=True)
    return [*rest, "--resume"] if holds_run else rest


def resume_argv(argv: list[str], sections, prog: str) -> list[str]:
    """A training command's `argv` with resumption decided: `--resume auto` settled
    (`resume_auto_argv`), then, when resuming, the run's saved `sections` put in front
    (`saved_config_argv`).

    Raises:
        SystemExit(2): --resume on a --out folder without config.yaml.
    """
    argv = resume_auto_argv(argv, prog)
    return saved_config_argv(argv, tuple(sections), prog) if "--resume" in argv else argv


def saved_config_argv(argv: list[str], sections, prog: str) -> list[str]:
    """`argv` with `--config SAVED.yaml` in front: the run directory's saved sections (`sections`,
    e.g. model/train/parallel) come first, so the user's own options override them.

    A saved `train.stop_at_step` was for the interrupted session, not for the continuation: it is
    reset to 0.

    Raises:
        SystemExit(2): --out names a folder without config.yaml (nothing to resume).
    """
    import sys

    out = out_dir_of(argv)
    if out is None:
        return argv
    saved = Path(out) / "config.yaml"
    if not saved.exists():
        print(f"{prog}: error: --resume but {saved} does not exist: nothing to resume", file=sys.stderr)
        raise SystemExit(2)
    doc = yaml.safe_load(saved.read_text()) or {}
    base = {k: doc[k] for k in sections if k in doc}
    base.get("train", {})["stop_at_step"] = 0
    tmp = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    yaml.safe_dump(base, tmp)
    tmp.close()
    return ["--config", tmp.name, *argv]


def check_resume(found: Path, source, mc, tc, global_batch_size: int, dp_size: int) -> None:
    """Refuse to resume checkpoint `found` with data, a model or a batch layout other than its own.

    Args:
        source: the run's BatchSource (checks its data against the saved config.yaml).
        mc: the resolved ModelConfig. tc: the TrainConfig. global_batch_size: sequences per step
            of this layout. dp_size: data-parallel ranks.

    Raises:
        InputError: another tokenizer, another model config, or another global batch size (the
            data order would change), each naming both values and what to do.
    """
    from gptforge.config import to_dict
    from gptforge.errors import InputError
    from gptforge.runtime import checkpoint as ckpt_lib

    saved = yaml.safe_load((found / "config.yaml").read_text()) or {}
    source.check_resume(saved, found)
    now = to_dict(mc)
    if isinstance(saved.get("model"), dict):
        # A checkpoint written before a model option existed lacks its key: fill it with the default.
        from gptforge.config import ModelConfig, from_dict

        try:
            saved["model"] = to_dict(from_dict(ModelConfig, saved["model"]).resolved())
        except ValueError:
            pass  # an unknown key or a bad value: reported below as a difference
    if saved.get("model") != now:
        diff = {k: (v, now.get(k)) for k, v in (saved.get("model") or {}).items() if now.get(k) != v}
        raise InputError(f"--resume: the model config differs from the checkpoint's ({found / 'config.yaml'}): "
                         + ", ".join(f"model.{k} was {a!r}, now {b!r}" for k, (a, b) in diff.items()))
    saved_gbs = (ckpt_lib.load_trainer_state(found).get("data") or {}).get("global_batch_size")
    if saved_gbs is not None and saved_gbs != global_batch_size:
        raise InputError(
            f"--resume: the checkpoint {found} was trained with a global batch of {saved_gbs} sequences, "
            f"this layout gives {global_batch_size} (train.micro_batch_size {tc.micro_batch_size} x "
            f"train.gradient_accumulation_steps {tc.gradient_accumulation_steps} x dp {dp_size}); set "
            "them so the product matches to continue the same data order"
        )


def recorded_data_dir(run_dir: str | Path) -> str | list[str]:
    """The data folder a run was trained on, from RUN_DIR/config.yaml (for `--resume` without --data).

    Raises:
        MissingInputError: no config.yaml, no recorded path, or the recorded folder is gone (the
            message names it and the --data option that overrides it).

    A relative recorded path (runs recorded before paths were made absolute) is looked for
    relative to the current folder, then relative to each parent of the run folder.
    """
    from gptforge.errors import MissingInputError

    saved = Path(run_dir) / "config.yaml"
    if not saved.is_file():
        raise MissingInputError(f"--resume: {saved} does not exist: nothing to resume")
    path = ((yaml.safe_load(saved.read_text()) or {}).get("data") or {}).get("path")
    if not path:
        raise MissingInputError(f"--resume: {saved} records no data folder; pass --data DIR")
    if isinstance(path, list):  # a mixture of several folders: each must still exist
        return [_recorded_path(p, saved, run_dir) for p in path]
    return _recorded_path(path, saved, run_dir)


def _recorded_path(path: str, saved: Path, run_dir) -> str:
    """One recorded data path, found again (see `recorded_data_dir`)."""
    from gptforge.errors import MissingInputError

    if Path(path).is_absolute():
        tried = [Path(path)]
    else:  # runs before absolute paths were recorded: relative to the folder the run was launched in
        tried = [Path.cwd() / path] + [parent / path for parent in Path(run_dir).resolve().parents]
    for candidate in tried:
        if candidate.exists():
            return str(candidate)
    where = (f"{tried[0]}" if len(tried) == 1 else
             f"{tried[0]} (relative to the current folder) nor under any parent of {Path(run_dir).resolve()}")
    raise MissingInputError(f"--resume: the run was trained on {path} (recorded in {saved}), which no longer "
                            f"exists: not at {where}; pass --data NEW_DIR if the shards moved")


def nothing_to_resume(run_dir: Path, main: bool, say) -> bool:
    """--resume on a run killed before or during its first checkpoint write: True, after saying
    so (with the number of logged steps that are redone) and removing (on the main rank `main`)
    its metrics.jsonl and tb/, so the run starts fresh rather than leave a folder that neither
    --resume nor a new run accepts. Steps logged without a checkpoint cannot be continued from;
    the same seed gives the same steps again. False for a folder that never held a run (no
    config.yaml: find_checkpoint's error then says what is missing) or that has a checkpoint;
    one whose checkpoints are all damaged raises find_checkpoint's error."""
    import shutil

    from gptforge.runtime import checkpoint as ckpt_lib

    if not (run_dir / "config.yaml").is_file():
        return False
    try:
        ckpt_lib.find_checkpoint(run_dir)
        return False
    except FileNotFoundError:
        pass
    metrics = run_dir / "metrics.jsonl"
    logged = len(metrics.read_text().splitlines()) if metrics.is_file() else 0
    progress = (f"{logged} logged step row(s) are redone from step 0" if logged else "no training progress")
    say(f"--resume: {run_dir} holds no complete checkpoint (the run stopped before its first one "
        f"was complete) and {progress}: starting fresh")
    for leftover in ("metrics.jsonl", "tb"):
        p = run_dir / leftover
        if main and p.is_file():
            p.unlink()
        elif main and p.is_dir():
            shutil.rmtree(p)
    return True
