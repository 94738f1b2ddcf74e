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
        print(f"{prog}: --resume but {saved} does not exist: nothing to resume", file=sys.stderr)
        raise SystemExit(2)
    doc = yaml.safe_load(saved.read_text()) or {}
    base = {k: doc[k] for k in sections if k in doc}
    base.get("train", {})["stop_at_step"] = 0
    tmp = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    yaml.safe_dump(base, tmp)
    tmp.close()
    return ["--config", tmp.name, *argv]
