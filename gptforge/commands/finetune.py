"""`gptforge finetune --from MODEL --data (FILE.jsonl | SHARD_DIR) --out RUN_DIR [--config recipe.yaml] [--section.key ...]`."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from gptforge.config import (
    FinetuneConfig,
    ModelConfig,
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


def run(fc: FinetuneConfig, cfg: RunConfig, source: str | Path | None, data: str | Path, run_dir: str | Path,
        resume: bool = False, progress: bool = True, log=None):
    """Fine-tune `source` on `data` into `run_dir` (see gptforge.train.finetune); returns loop.train's
    TrainResult. `cfg.model` is ignored: the model is the source's.

    Raises:
        FileNotFoundError: missing source, data, tokenizer, or nothing to resume.
        ValueError: a bad config or data that does not fit the model (the message names it).
    """
    import os

    import torch

    from gptforge.config import from_dict, to_dict
    from gptforge.runtime.adapters import save_adapter_from_checkpoint
    from gptforge.runtime.checkpoint import find_checkpoint
    from gptforge.runtime.device import pick_device
    from gptforge.runtime.loading import load_pretrained
    from gptforge.train import finetune as ft
    from gptforge.train.loop import train

    say = log or (lambda m: None)
    run_dir, data = Path(run_dir), Path(data)
    device = pick_device(cfg.train.device)
    ft.check_method(fc, device, cfg.train.precision, cfg.parallel)
    chat_template = None
    if fc.chat_template not in ("auto", "default"):
        chat_template = Path(fc.chat_template)
        if not chat_template.is_file():
            raise FileNotFoundError(f"finetune.chat_template {chat_template}: no such file (or use auto / default)")
    if not data.exists():
        raise FileNotFoundError(f"--data {data}: no such file or folder (an instruction .jsonl or a shard folder)")
    if data.is_dir() and not (data / "meta.json").is_file():
        raise FileNotFoundError(f"--data {data}: a folder without meta.json; give a `gptforge prepare` shard folder "
                                "or an instruction .jsonl file")

    if resume:
        saved = run_dir / "config.yaml"
        if not saved.is_file():
            raise FileNotFoundError(f"--resume but {saved} does not exist: nothing to resume")
        doc = yaml.safe_load(saved.read_text()) or {}
        mc = from_dict(ModelConfig, doc["model"], "model.").resolved()
        source = source or (doc.get("base_model") or {}).get("path")
        find_checkpoint(run_dir)  # fail before any data work
        tok_dir = run_dir if (run_dir / "tokenizer.json").is_file() else None
        model = None
    else:
        if source is None:
            raise ValueError("--from is required: a Hugging Face model folder or a gptforge run directory")
        say(f"loading {source}")
        model, src = load_pretrained(Path(source), dtype=torch.float32)
        mc = model.config
        tok_dir = src["tokenizer_dir"]
        if int(os.environ.get("RANK", "0")) == 0:
            ft.write_export_inputs(run_dir, src, chat_template)
        tok_dir = run_dir if (run_dir / "tokenizer.json").is_file() else tok_dir

    seq_len = ft.seq_len_for(fc, mc.block_size)
    if data.is_file():
        if tok_dir is None:
            raise FileNotFoundError(f"{source}: no tokenizer.json beside the model; instruction data needs the "
                                    "model's tokenizer")
        tok = ft.load_chat_tokenizer(Path(tok_dir), chat_template if not resume else None)
        source_data = ft.InstructionData(data, tok, seq_len, fc, cfg.train.seed)
    else:
        tok_json = Path(tok_dir) / "tokenizer.json" if tok_dir is not None else None
        source_data = ft.ShardData(data, seq_len, cfg.train.eval_steps, cfg.train.micro_batch_size,
                                   tok_json if tok_json is not None and tok_json.is_file() else None)

    def model_factory(_mc):
        m = ft.empty_model(mc) if model is None else model
        # On resume the 4-bit base comes from the checkpoint: allocate it, do not quantize garbage.
        ft.prepare_model(m, fc, device, cfg.train.precision, quantize=model is not None, progress=progress)
        return m

    base = str(Path(source).resolve()) if source is not None else None
    extra = {"finetune": to_dict(fc), "base_model": {"path": base}}
    lora = fc.method != "full"
    on_save = (lambda step, path: save_adapter_from_checkpoint(path, path / ft.ADAPTER_DIR, base)) if lora else None
    say(f"fine-tuning ({fc.method}) at sequence length {seq_len}")
    result = train(RunConfig(model=mc, train=cfg.train, parallel=cfg.parallel), data, run_dir, resume=resume,
                   progress=progress, log=log, model_factory=model_factory, data=source_data,
                   config_extra=extra, on_save=on_save)
    if lora and int(os.environ.get("RANK", "0")) == 0:
        save_adapter_from_checkpoint(find_checkpoint(run_dir), run_dir / ft.ADAPTER_DIR, base)
    return result


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
        result = run(fc, cfg, ns.source, ns.data, ns.out, resume=ns.resume, progress=not ns.quiet,
                     log=lambda m: console.print(m, highlight=False))
    except (FileNotFoundError, FileExistsError, ValueError, RuntimeError) as e:
        print(f"gptforge finetune: error: {e}", file=sys.stderr)
        return 1
    console.print(result.summary(), highlight=False)
    return result.exit_code
