"""`gptforge pretrain --data DIR --out RUN_DIR [--config recipe.yaml] [--section.key value ...]`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from gptforge.config import SECTIONS, run_config_from
from gptforge.options import command_parser, parse_command

# One description: `gptforge --help` lists SUMMARY (read from this file unimported); DESCRIPTION begins with it.
SUMMARY = "Train a GPT from scratch on token shards written by `gptforge prepare`."

DESCRIPTION = SUMMARY + """

Every option can also be set in a YAML recipe (--config) under model:, train: or parallel:;
command-line options override the recipe. With --resume, the run directory's config.yaml is the
base and the options given here override it (e.g. a new --train.stop_at_step); --data then
defaults to the folder the run was trained on."""


@dataclass
class PretrainOptions:
    out: str
    """Run directory: config.yaml, metrics.jsonl, tb/, checkpoints/."""
    data: Optional[list[str]] = None
    """Shard folder written by `gptforge prepare` (meta.json, *.bin); several folders sharing a
    tokenizer, or one prepared with several --source, train on a mixture (see --data-weights).
    With --resume: default the one(s) recorded in RUN_DIR/config.yaml."""
    data_weights: Optional[str] = None
    """Shortcut for --train.data_weights: NAME=WEIGHT,... over the sources (a folder's name for
    several --data folders), e.g. en=0.7,zh=0.3; default proportional to train tokens. A
    mixture's val_loss is the token-weighted mean over the sources' val splits."""
    resume: bool = False
    """Continue from RUN_DIR/checkpoints/latest. `--resume auto`: continue when RUN_DIR holds a
    run, start one otherwise (the same command line for the first start and every restart)."""
    quiet: bool = False
    """No progress bar."""
    backend: Optional[Literal["torch", "deepspeed"]] = None
    """Shortcut for --parallel.backend."""
    deepspeed_config: Optional[str] = None
    """Shortcut for --parallel.deepspeed_config."""
    sanity_overfit: bool = False
    """Instead of training, check that the model can memorise one fixed batch in --train.max_steps
    steps (loss below 0.1 nats/token); exit 1 with what to check when it cannot."""


def build_parser():
    return command_parser("gptforge pretrain", DESCRIPTION, PretrainOptions, sections=SECTIONS)


def main(argv: list[str]) -> int:
    from gptforge.train.resume import resume_argv

    argv = resume_argv(argv, SECTIONS, "gptforge pretrain")
    opts, init = parse_command(build_parser(), argv)
    cfg = run_config_from(init)
    if opts.backend is not None:
        cfg.parallel.backend = opts.backend
    if opts.deepspeed_config is not None:
        cfg.parallel.deepspeed_config = opts.deepspeed_config
        if opts.backend is None:
            cfg.parallel.backend = "deepspeed"
    if opts.data_weights is not None:
        from gptforge.train.sources.mixture import parse_data_weights

        cfg.train.data_weights = parse_data_weights(opts.data_weights)
    from rich.console import Console

    from gptforge.train.resume import recorded_data_dir
    from gptforge.train.run import train

    data = opts.data
    if data is None:
        if not opts.resume:
            from gptforge.errors import InputError

            raise InputError("--data is required: the shard folder written by `gptforge prepare` (with --resume it "
                             "defaults to the one in RUN_DIR/config.yaml)")
        data = recorded_data_dir(opts.out)
    elif len(data) == 1:
        data = data[0]
    console = Console(stderr=False)
    if opts.sanity_overfit:
        from gptforge.train.workflows.sanity import sanity_overfit

        if isinstance(data, list):
            from gptforge.errors import InputError

            raise InputError("--sanity-overfit takes one shard folder (--data DIR), not a mixture of several")

        check = sanity_overfit(cfg, data, opts.out, progress=not opts.quiet,
                               log=lambda m: console.print(m, highlight=False))
        console.print(check.summary(), highlight=False)
        return 0 if check.passed else 1
    result = train(cfg, data, opts.out, resume=opts.resume, progress=not opts.quiet,
                   log=lambda m: console.print(m, highlight=False))
    if result.main:  # every rank returns a result; one line per run
        console.print(result.summary(), highlight=False)
    return result.exit_code
