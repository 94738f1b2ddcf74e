"""`gptforge distill --teacher RUN --student PRESET_OR_RUN --data SHARDS --out RUN_D`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from gptforge.config import SECTIONS, run_config_from
from gptforge.options import command_parser, parse_command

# One description: `gptforge --help` lists SUMMARY (read from this file unimported); DESCRIPTION begins with it.
SUMMARY = "Train a student to match a frozen teacher's next-token distribution (logit distillation)."

DESCRIPTION = SUMMARY + """

The loss is T^2 * KL(teacher || student at temperature T) + alpha * cross-entropy
(Hinton et al. 2015; forward KL as Minitron), with the normal trainer (checkpoints, --resume,
metrics, report; val loss is the plain cross-entropy). The student is a preset (a new model of
that shape) or a run directory whose weights it starts from (e.g. `gptforge prune` output).
Teacher, student and data must share the tokenizer. With --resume the run's config.yaml holds the
teacher, student, alpha and temperature."""


@dataclass
class DistillOptions:
    out: str
    """Run directory of the student."""
    teacher: Optional[str] = None
    """Teacher run directory or checkpoint (frozen, eval mode)."""
    student: Optional[str] = None
    """A preset name (a new model) or a run directory to start from."""
    data: Optional[str] = None
    """Token shards from `gptforge prepare` with the teacher's tokenizer."""
    alpha: float = 0.0
    """Weight of the cross-entropy on the data's next tokens (0: KL only, as Minitron)."""
    temperature: float = 1.0
    """Softmax temperature T of both distributions (the KL term is scaled by T^2)."""
    teacher_dtype: Optional[Literal["fp32", "bf16", "fp16"]] = None
    """Keep the teacher's weights in this dtype (default: as stored)."""
    resume: bool = False
    """Continue from RUN_DIR/checkpoints/latest. `--resume auto`: continue when RUN_DIR holds a
    run, start one otherwise (the same command line for the first start and every restart)."""
    quiet: bool = False
    """No progress bar."""


def main(argv: list[str]) -> int:
    saved: dict = {}
    from gptforge.train.resume import resume_auto_argv

    argv = resume_auto_argv(argv, "gptforge distill")
    if "--resume" in argv:
        import yaml

        from gptforge.train.resume import out_dir_of, saved_config_argv

        argv = saved_config_argv(argv, tuple(SECTIONS), "gptforge distill")
        saved = (yaml.safe_load(open(f"{out_dir_of(argv)}/config.yaml")) or {}).get("distill") or {}
    opts, init = parse_command(command_parser("gptforge distill", DESCRIPTION, DistillOptions, sections=SECTIONS), argv)
    from rich.console import Console

    from gptforge.errors import InputError
    from gptforge.train.resume import recorded_data_dir
    from gptforge.train.workflows.distill import distill

    teacher = opts.teacher or saved.get("teacher")
    student = opts.student or saved.get("student")
    if teacher is None or student is None:
        raise InputError("--teacher RUN and --student PRESET_OR_RUN are required")
    data = opts.data or (recorded_data_dir(opts.out) if opts.resume else None)
    if data is None:
        raise InputError("--data is required: token shards prepared with the teacher's tokenizer")
    alpha = opts.alpha if "--alpha" in argv or not saved else saved.get("alpha", opts.alpha)
    temperature = opts.temperature if "--temperature" in argv or not saved else saved.get("temperature", 1.0)
    if isinstance(data, list):  # a mixture's recorded folders: distillation reads one token-shard folder
        raise InputError(f"--data: distill trains on one token-shard folder, the run records {len(data)}")
    console = Console(stderr=False)
    result = distill(run_config_from(init), teacher, student, data, opts.out, alpha=alpha, temperature=temperature,
                     teacher_dtype=opts.teacher_dtype or saved.get("teacher_dtype"), resume=opts.resume,
                     progress=not opts.quiet, log=lambda m: console.print(m, highlight=False))
    if result.main:  # every rank returns a result; one line per run
        console.print(result.summary(), highlight=False)
    return result.exit_code
