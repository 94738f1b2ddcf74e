"""`gptforge pretrain --data DIR --out RUN_DIR [--config recipe.yaml] [--section.key value ...]`."""

from __future__ import annotations

import sys

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


def main(argv: list[str]) -> int:
    if "--resume" in argv:
        from gptforge.train.resume import saved_config_argv

        argv = saved_config_argv(argv, ("model", "train", "parallel"), "gptforge pretrain")
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
    console.print(result.summary(), highlight=False)
    return result.exit_code
