"""`gptforge finetune --from MODEL --data (FILE.jsonl | SHARD_DIR) --out RUN_DIR [--config recipe.yaml] [--section.key ...]`."""

from __future__ import annotations

import sys

from gptforge.config import (
    FinetuneConfig,
    ParallelConfig,
    RunConfig,
    TrainConfig,
    make_parser,
    parse_args,
)

DESCRIPTION = """Fine-tune a pretrained model: a Hugging Face folder (GPT-2, Llama 2/3, Mistral, Qwen2) or a
gptforge run directory, on an instruction .jsonl (prompt/completion or chat messages; the loss counts
completion tokens only) or on a shard folder from `gptforge prepare --tokenizer MODEL/tokenizer.json`
(continued pretraining). Full fine-tuning, LoRA, or QLoRA (LoRA on a 4-bit NF4 base through
bitsandbytes: pip install 'gptforge[qlora]'; CPU or CUDA, one process) (--finetune.method). Same loop,
logging, checkpoints and --resume as pretrain. (Q)LoRA runs also write PEFT adapters (RUN_DIR/adapter
and in each checkpoint); `gptforge convert --to-hf RUN_DIR --out HF_DIR` writes the merged model (for
QLoRA: the dequantized 4-bit base plus the adapters).

Options go under train:, parallel: and finetune: in a YAML recipe (--config) or on the command line.
Defaults differ from pretrain: train.lr 2e-4 (use about 1e-5..5e-5 for full fine-tuning of large models),
train.min_lr 2e-5, train.warmup_steps 20, train.weight_decay 0, train.max_steps 500."""

SECTIONS = {"train": TrainConfig, "parallel": ParallelConfig, "finetune": FinetuneConfig}
FINETUNE_DEFAULTS = {"train.lr": 2e-4, "train.min_lr": 2e-5, "train.warmup_steps": 20, "train.weight_decay": 0.0,
                     "train.max_steps": 500}


def build_parser():
    parser = make_parser("gptforge finetune", DESCRIPTION, sections=SECTIONS)
    parser.set_defaults(FINETUNE_DEFAULTS)
    parser.add_argument("--from", dest="source", default=None,
                        help="Pretrained model: a Hugging Face folder (config.json + safetensors) or a gptforge run "
                             "directory / checkpoint. With --resume: default the one the run started from.")
    parser.add_argument("--data", required=True,
                        help="Instruction .jsonl (prompt/completion or messages rows) or a shard folder (meta.json).")
    parser.add_argument("--out", required=True, help="Run directory: config.yaml, metrics.jsonl, checkpoints/, "
                                                     "tokenizer, adapter/.")
    parser.add_argument("--resume", action="store_true", help="Continue from RUN_DIR/checkpoints/latest.")
    parser.add_argument("--quiet", action="store_true", help="No progress bar.")
    return parser


def main(argv: list[str]) -> int:
    if "--resume" in argv:
        from gptforge.train.resume import saved_config_argv

        argv = saved_config_argv(argv, SECTIONS, "gptforge finetune")
    init, ns = parse_args(build_parser(), argv)
    fc: FinetuneConfig = init.finetune
    cfg = RunConfig(train=init.train, parallel=init.parallel)
    from rich.console import Console

    console = Console(stderr=False)
    try:
        from gptforge.train.finetune import finetune

        result = finetune(fc, cfg, ns.source, ns.data, ns.out, resume=ns.resume, progress=not ns.quiet,
                     log=lambda m: console.print(m, highlight=False))
    except (FileNotFoundError, FileExistsError, ValueError, RuntimeError) as e:
        print(f"gptforge finetune: error: {e}", file=sys.stderr)
        return 1
    console.print(result.summary(), highlight=False)
    return result.exit_code
