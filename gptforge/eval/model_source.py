"""The model an evaluation scores: a run directory, a checkpoint folder or a Hugging Face folder,
with its saved config and tokenizer, and the fingerprint results record it under."""

from __future__ import annotations

import hashlib
from pathlib import Path

from gptforge.atomic import file_sha256


def load_eval_model(model: str, device, best: bool = False):
    """(model in eval mode on `device`, checkpoint path, saved config dict, tokenizer.json path or None).

    `model` is a run directory (its checkpoints/latest, or checkpoints/best with `best`), a
    checkpoint folder, or a Hugging Face folder (config.json without config.yaml; its config dict
    is empty). Errors are those of `gptforge.runtime.loading`."""
    from gptforge.runtime.loading import load_for_inference, load_pretrained

    path = Path(model)
    if (path / "config.json").is_file() and not (path / "config.yaml").is_file():
        net, src = load_pretrained(path)
        tok = src["tokenizer_dir"] / "tokenizer.json" if src["tokenizer_dir"] else None
        return net.to(device).eval(), path, {}, tok if tok is not None and tok.is_file() else None
    return load_for_inference(model, device, "best" if best else "latest")


def tree_sha256(path: Path) -> str:
    """SHA-256 (hex) over a checkpoint folder's files (relative names and bytes, sorted), or of one file."""
    if path.is_file():
        return file_sha256(path)
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode() + b"\0" + file_sha256(f).encode())
    return h.hexdigest()


def results_path(model: str, out: str | None, name: str = "results.json") -> Path:
    """Where task results go: `out`, else MODEL/eval/`name` (for a checkpoint step folder, the
    eval/ folder of the run that holds it)."""
    model_dir = Path(model)
    if model_dir.parent.name == "checkpoints":  # a step folder: results beside it in the run, not inside it
        model_dir = model_dir.parent.parent
    return Path(out) if out else model_dir / "eval" / name


def check_results_out(out: str | None) -> None:
    """Refuse an `evaluate --out` path inside a run folder (one holding config.yaml beside
    checkpoints/ or metrics.jsonl) but not under its eval/ folder: results written there could
    replace the run's own files (its config.yaml, metrics, checkpoints).

    Raises:
        InputError: naming the run folder and the eval/ path to use instead.
    """
    from gptforge.errors import InputError

    if not out:
        return
    path = Path(out).resolve()
    for run in path.parents:
        if (run / "config.yaml").is_file() and ((run / "checkpoints").is_dir() or (run / "metrics.jsonl").is_file()):
            if (run / "eval") not in (path, *path.parents):
                raise InputError(f"--out {out} lies inside the run folder {run}, outside its eval/ folder: "
                                 f"results there could replace the run's own files; give a path under "
                                 f"{run / 'eval'} (e.g. {run / 'eval' / path.name}) or outside the run")
            return
