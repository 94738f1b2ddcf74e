"""`gptforge rl --from MODEL --prompts train.jsonl --reward SPEC --out RUN_DIR [--rl.key ...] [--train.key ...]`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from gptforge.config import FinetuneConfig, ParallelConfig, RLConfig, RunConfig, TrainConfig
from gptforge.options import command_parser, parse_command

# One description: `gptforge --help` lists SUMMARY (read from this file unimported); DESCRIPTION begins with it.
SUMMARY = "Reinforcement learning with verifiable rewards (GRPO / DAPO) from a Hugging Face or gptforge model."

DESCRIPTION = SUMMARY + """

Each step samples rl.samples_per_prompt completions of rl.prompts_per_step prompts from the current weights (gptforge's
batched KV-cache generation), scores them with a program (--reward: exact, regex:PATTERN,
json_schema:FILE, python:FILE:FUNCTION; or several with weights through --rl.rewards FILE.yaml),
and takes the clipped policy-gradient step with group advantages (reward - group mean), token-level
(DAPO) or per-sequence (GRPO) normalisation, an optional k3 KL penalty (rl.kl_beta), dynamic sampling
and overlong shaping. Prompt rows: {"prompt", "answer"} or {"messages", "answer"} (other columns
reach the reward). Full or LoRA (--finetune.method), from a Hugging Face folder or a gptforge run;
one process or DDP (torchrun / gptforge launch); FSDP2, tensor and pipeline parallel are not
supported for RL. Same checkpoints, --resume (bit for bit: the sampler's state is in the checkpoint),
metrics.jsonl and report as finetune; held-out samples go to RUN_DIR/samples/.

Defaults differ from finetune: finetune.method full, train.lr 1e-5, train.warmup_steps 0,
train.weight_decay 0, train.max_steps 100, train.lr_schedule constant, and parallel.dp_replicate -1 with
parallel.dp_shard 1 (DDP over the processes torchrun starts). docs/rl.md says how they were chosen."""

SECTIONS = {"train": TrainConfig, "parallel": ParallelConfig, "finetune": FinetuneConfig, "rl": RLConfig}
RL_DEFAULTS = {"finetune.method": "full", "train.lr": 1e-5, "train.min_lr": 1e-5, "train.warmup_steps": 0,
               "train.weight_decay": 0.0, "train.max_steps": 100, "train.grad_clip": 1.0,
               "train.lr_schedule": "constant", "parallel.dp_replicate": -1, "parallel.dp_shard": 1}


@dataclass
class RLOptions:
    out: str
    """Run directory: config.yaml, metrics.jsonl, checkpoints/, samples/, tokenizer."""
    prompts: Optional[str] = None
    """Training prompts .jsonl: {"prompt", "answer"} or {"messages", "answer"} rows."""
    reward: Optional[str] = None
    """exact | regex:PATTERN | json_schema:FILE | python:FILE:FUNCTION (or --rl.rewards FILE.yaml)."""
    source: Optional[str] = field(default=None, metadata={"flag": "--from"})
    """Starting model: a Hugging Face folder or a gptforge run directory (e.g. an SFT run)."""
    resume: bool = False
    """Continue from RUN_DIR/checkpoints/latest. `--resume auto`: continue when RUN_DIR holds a
    run, start one otherwise."""
    quiet: bool = False
    """No progress bar."""


def build_parser():
    parser = command_parser("gptforge rl", DESCRIPTION, RLOptions, sections=SECTIONS)
    parser.set_defaults(RL_DEFAULTS)
    return parser


def main(argv: list[str]) -> int:
    from gptforge.train.resume import resume_argv

    argv = resume_argv(argv, SECTIONS, "gptforge rl")
    opts, init = parse_command(build_parser(), argv)
    from rich.console import Console

    from gptforge.train.workflows.rl import rl

    console = Console(stderr=False)
    result = rl(init.rl, init.finetune, RunConfig(train=init.train, parallel=init.parallel), opts.source,
                opts.prompts, opts.reward, opts.out, resume=opts.resume, progress=not opts.quiet,
                log=lambda m: console.print(m, highlight=False))
    if result.main:
        console.print(result.summary(), highlight=False)
    return result.exit_code
