"""`gptforge finetune --from MODEL --data (FILE.jsonl | SHARD_DIR) --out RUN_DIR [--config recipe.yaml] [--section.key ...]`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from gptforge.config import FinetuneConfig, ParallelConfig, RunConfig, TrainConfig
from gptforge.options import command_parser, parse_command

# One description: `gptforge --help` lists SUMMARY (read from this file unimported); DESCRIPTION begins with it.
SUMMARY = "Fine-tune a Hugging Face or gptforge model (full, LoRA or QLoRA) on instruction .jsonl or shards."

DESCRIPTION = SUMMARY + """

Fine-tune a pretrained model: a Hugging Face folder (GPT-2, Llama 2/3, Mistral, Qwen2) or a
gptforge run directory, on an instruction .jsonl (prompt/completion or chat messages; the loss counts
completion tokens only) or on a shard folder from `gptforge prepare --tokenizer MODEL/tokenizer.json`
(continued pretraining). Full fine-tuning, LoRA, or QLoRA (LoRA on a 4-bit NF4 base through
bitsandbytes: pip install 'gptforge[qlora]'; CPU or CUDA, one process) (--finetune.method). Same loop,
logging, checkpoints and --resume as pretrain. (Q)LoRA runs also write PEFT adapters (RUN_DIR/adapter
and in each checkpoint); `gptforge convert --to-hf RUN_DIR --out HF_DIR` writes the merged model (for
QLoRA: the dequantized 4-bit base plus the adapters). --finetune.objective dpo tunes on preference pairs
instead (TRL's prompt/chosen/rejected rows; losses sigmoid, ipo, simpo, orpo; docs/training.md).

Options go under train:, parallel: and finetune: in a YAML recipe (--config) or on the command line.
Defaults differ from pretrain: train.lr by method and model width (LoRA/QLoRA: pretrain's width rule,
e.g. 0.0025 at d_model 32, 2e-4 at 4096; full: a tenth of it; gptforge.train.optim.finetune_lr),
train.min_lr lr/10, train.warmup_steps 5% of max_steps (at most a quarter of the run),
train.weight_decay 0, train.max_steps 500. With --finetune.objective dpo: train.lr by model width
(1e-5 at d_model 64 down to TRL's 1e-6 at 4096; gptforge.train.workflows.preference.dpo_default_lr),
min_lr lr/10, warmup 10% of the steps."""

SECTIONS = {"train": TrainConfig, "parallel": ParallelConfig, "finetune": FinetuneConfig}
FINETUNE_DEFAULTS = {"train.weight_decay": 0.0, "train.max_steps": 500}


@dataclass
class FinetuneOptions:
    out: str
    """Run directory: config.yaml, metrics.jsonl, checkpoints/, tokenizer, adapter/."""
    data: str
    """Instruction .jsonl (prompt/completion or messages rows), a shard folder (meta.json), or with
    --finetune.objective dpo a .jsonl of preference pairs."""
    source: Optional[str] = field(default=None, metadata={"flag": "--from"})
    """Pretrained model: a Hugging Face folder (config.json + safetensors) or a gptforge run
    directory / checkpoint. With --resume: default the one the run started from."""
    resume: bool = False
    """Continue from RUN_DIR/checkpoints/latest. `--resume auto`: continue when RUN_DIR holds a
    run, start one otherwise (the same command line for the first start and every restart)."""
    quiet: bool = False
    """No progress bar."""


def build_parser():
    parser = command_parser("gptforge finetune", DESCRIPTION, FinetuneOptions, sections=SECTIONS)
    parser.set_defaults(FINETUNE_DEFAULTS)
    return parser


def main(argv: list[str]) -> int:
    from gptforge.train.resume import resume_argv

    argv = resume_argv(argv, SECTIONS, "gptforge finetune")
    opts, init = parse_command(build_parser(), argv)
    cfg = RunConfig(train=init.train, parallel=init.parallel)
    from rich.console import Console

    from gptforge.train.workflows.finetune import finetune

    console = Console(stderr=False)
    result = finetune(init.finetune, cfg, opts.source, opts.data, opts.out, resume=opts.resume,
                      progress=not opts.quiet, log=lambda m: console.print(m, highlight=False))
    if result.main:  # every rank returns a result; one line per run
        console.print(result.summary(), highlight=False)
    return result.exit_code
