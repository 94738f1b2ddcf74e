"""`gptforge pretrain --data DIR --out RUN_DIR [--config recipe.yaml] [--section.key value ...]`."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import yaml

from gptforge.config import make_parser, parse_args, run_config_from

DESCRIPTION = """Train a GPT from scratch on token shards written by `gptforge prepare`.

Every option can also be set in a YAML recipe (--config) under model:, train: or parallel:;
command-line options override the recipe. With --resume, the run directory's config.yaml is the
base and the options given here override it (e.g. a new --train.stop_at_step)."""


def build_parser():
    parser = make_parser("gptforge pretrain", DESCRIPTION)
    parser.add_argument("--data", required=True, help="Shard folder written by `gptforge prepare` (meta.json, *.bin).")
    parser.add_argument("--out", required=True, help="Run directory: config.yaml, metrics.jsonl, tb/, checkpoints/.")
    parser.add_argument("--resume", action="store_true", help="Continue from RUN_DIR/checkpoints/latest.")
    parser.add_argument("--quiet", action="store_true", help="No progress bar.")
    parser.add_argument("--backend", choices=["torch", "deepspeed"], default=None,
                        help="Shortcut for --parallel.backend.")
    parser.add_argument("--deepspeed-config", default=None, help="Shortcut for --parallel.deepspeed_config.")
    return parser


def _resume_argv(argv: list[str]) -> list[str]:
    """Put the run directory's saved config before the user's options, so they override it."""
    out = None
    for i, a in enumerate(argv):
        if a == "--out" and i + 1 < len(argv):
            out = argv[i + 1]
        elif a.startswith("--out="):
            out = a.split("=", 1)[1]
    if out is None:
        return argv
    saved = Path(out) / "config.yaml"
    if not saved.exists():
        print(f"gptforge pretrain: --resume but {saved} does not exist: nothing to resume", file=sys.stderr)
        raise SystemExit(2)
    doc = yaml.safe_load(saved.read_text())
    base = {k: doc[k] for k in ("model", "train", "parallel") if k in doc}
    # A saved stop_at_step was for the interrupted session, not for the continuation.
    base.get("train", {})["stop_at_step"] = 0
    tmp = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    yaml.safe_dump(base, tmp)
    tmp.close()
    return ["--config", tmp.name, *argv]


def main(argv: list[str]) -> int:
    if "--resume" in argv:
        argv = _resume_argv(argv)
    init, ns = parse_args(build_parser(), argv)
    cfg = run_config_from(init)
    if ns.backend is not None:
        cfg.parallel.backend = ns.backend
    if ns.deepspeed_config is not None:
        cfg.parallel.deepspeed_config = ns.deepspeed_config
        if ns.backend is None:
            cfg.parallel.backend = "deepspeed"
    from rich.console import Console

    from gptforge.train.loop import train

    console = Console(stderr=False)
    try:
        result = train(cfg, ns.data, ns.out, resume=ns.resume, progress=not ns.quiet,
                       log=lambda m: console.print(m, highlight=False))
    except (FileNotFoundError, FileExistsError, ValueError, RuntimeError) as e:
        print(f"gptforge pretrain: error: {e}", file=sys.stderr)
        return 1
    return report(console, result)


def report(console, result) -> int:
    """Print how a run ended; the exit code is 128 + signal for a run stopped by SIGINT/SIGTERM
    (as a shell reports a killed program), so schedulers can tell it from a finished run."""
    if not result.history and result.stopped == "max_steps":
        console.print(f"nothing to do: {result.run_dir} is already at train.max_steps ({result.step}); "
                      "raise --train.max_steps to train further", highlight=False)
        return 0
    val = f", val loss {result.val_loss:.4f}" if result.val_loss is not None else ""
    train_loss = f"{result.train_loss:.4f}" if result.train_loss is not None else "n/a"
    console.print(f"stopped ({result.stopped}) at step {result.step}: train loss {train_loss}{val}; "
                  f"run directory {result.run_dir}", highlight=False)
    return 128 + int(result.signal) if result.signal else 0
