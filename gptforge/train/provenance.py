"""Provenance of a run: what config.yaml records besides the config (data hashes, versions, git commit)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import yaml

import gptforge
from gptforge.atomic import file_sha256
from gptforge.config import RunConfig, to_dict


def git_commit() -> str | None:
    """The git commit of the gptforge checkout this runs from, or None when installed as a wheel."""
    here = Path(gptforge.__file__).resolve().parent.parent
    if not (here / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def data_provenance(path: Path) -> dict[str, Any]:
    """config.yaml's `data` section: the absolute path and hashes that identify the training data.

    A shard folder: its meta.json's sha256 and the tokenizer's sha256 (from meta.json). A data
    file (an instruction .jsonl): the file's own sha256.
    """
    path = Path(path).resolve()  # absolute: a resume from another folder finds it again
    if path.is_file():
        return {"path": str(path), "sha256": file_sha256(path)}
    meta_path = path / "meta.json"
    return {"path": str(path), "meta_sha256": file_sha256(meta_path),
            "tokenizer_sha256": json.loads(meta_path.read_text()).get("tokenizer_sha256")}


def run_config_yaml(cfg: RunConfig, data: dict[str, Any], extra: dict[str, Any] | None = None) -> str:
    """The resolved config plus provenance (`data`: see `data_provenance`; versions; git commit;
    the command line that started the process)."""
    doc = to_dict(cfg)
    doc["data"] = data
    doc["versions"] = {"gptforge": gptforge.__version__, "torch": str(torch.__version__), "git_commit": git_commit()}
    doc["command"] = " ".join(shlex.quote(a) for a in sys.argv)
    if extra:
        doc.update(extra)
    return yaml.safe_dump(doc, sort_keys=False)
