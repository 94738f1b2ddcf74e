"""Fine-tuning a pretrained model with the pretraining loop (`gptforge finetune`).

What this module adds to `gptforge.train.run.train`, through its hooks:
- a model factory: the pretrained weights (a Hugging Face folder or a gptforge run), with LoRA
  adapters added and the base frozen for `method=lora`, and for `method=qlora` the blocks' linear
  layers also stored in 4 bits (gptforge.model.qlora; on resume the model is only allocated: the
  checkpoint holds every weight, the 4-bit ones in their packed form);
- a data source: instruction .jsonl (completion-only loss, packed or padded, a held-out val set),
  or a token shard folder (continued pretraining) at the fine-tuning sequence length, so the model
  keeps its own context length for export;
- the run directory's export inputs: tokenizer files, `hf_config.json`, `generation_config.json`
  (so `gptforge convert --to-hf RUN` rebuilds the same Hugging Face model type), and for LoRA and
  QLoRA runs a PEFT adapter folder (`adapter_config.json` + `adapter_model.safetensors`) inside every
  checkpoint and at RUN_DIR/adapter.

`convert --to-hf` of a LoRA run merges the adapters into the base weights (`load_lora_for_export`,
`merge_for_export`); of a QLoRA run it first dequantizes the 4-bit base, so the exported weights are
dequant(W4) + alpha/r * B A: what the run trained against, not the original weights plus adapters.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch
import yaml

from gptforge.atomic import atomic_copy, atomic_write_text
from gptforge.config import FinetuneConfig, ModelConfig, RunConfig
from gptforge.model.lora import LoRAConfig, apply_lora
from gptforge.model.qlora import QuantConfig
from gptforge.train.sources import BatchSource, InstructionData, ShardSource

MAX_DEFAULT_BLOCK = 2048
ADAPTER_DIR = "adapter"


# ---------------------------------------------------------------------------------------------
# Config helpers


def lora_config(fc: FinetuneConfig) -> LoRAConfig:
    """The LoRAConfig of a fine-tuning config (validated by `LoRAConfig.targets` when applied)."""
    return LoRAConfig(rank=fc.lora_rank, alpha=fc.lora_alpha, dropout=fc.lora_dropout,
                      target_modules=list(fc.lora_target_modules))


def quant_config(fc: FinetuneConfig, precision: str = "fp32") -> QuantConfig:
    """The QuantConfig of a qlora fine-tuning config; compute dtype auto -> bf16 under
    train.precision bf16, else fp32."""
    compute = fc.qlora_compute_dtype
    if compute == "auto":
        compute = "bf16" if precision == "bf16" else "fp32"
    return QuantConfig(quant_type=fc.qlora_quant_type, double_quant=fc.qlora_double_quant, compute_dtype=compute)


def seq_len_for(fc: FinetuneConfig, model_block_size: int) -> int:
    """Training sequence length: finetune.block_size, else min(model context, 2048).

    Raises:
        ValueError: finetune.block_size longer than the model's context or below 2.
    """
    if fc.block_size is None:
        return min(model_block_size, MAX_DEFAULT_BLOCK)
    if not 2 <= fc.block_size <= model_block_size:
        raise ValueError(f"finetune.block_size={fc.block_size} must be between 2 and the model's context length "
                         f"({model_block_size})")
    return fc.block_size


def check_method(fc: FinetuneConfig, device: torch.device, precision: str = "fp32", parallel=None) -> None:
    """Refuse what cannot run here, before any weights are loaded.

    Raises:
        ValueError: a bad LoRA or quantization config; qlora with a distributed layout (QLoRA
            runs in one process here: its 4-bit buffers are not sharded by FSDP2/TP/PP).
        QLoRAUnavailable (a RuntimeError): qlora without bitsandbytes, or on a device where
            bitsandbytes cannot run 4-bit quantization (checked by running it).
    """
    if fc.method in ("lora", "qlora"):
        lora_config(fc).targets()
    if fc.method == "qlora":
        from gptforge.model.qlora import check_device

        qcfg = quant_config(fc, precision)
        qcfg.validate()
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world > 1 or (parallel is not None and (parallel.tp > 1 or parallel.pp > 1 or parallel.uses_fsdp()
                                                   or parallel.uses_ddp())):
            raise ValueError("finetune.method=qlora runs in a single process (one GPU or the CPU) in this version: "
                             "drop the parallel.* layout / torchrun, or use --finetune.method lora for multi-GPU runs")
        check_device(device, qcfg)


# ---------------------------------------------------------------------------------------------
# Models


def empty_model(mc: ModelConfig) -> torch.nn.Module:
    """A GPT with allocated but unset weights (fp32, CPU): for resuming, where the checkpoint
    provides every tensor. Built on the meta device, so no time goes into random init."""
    from gptforge.model.gpt import GPT

    with torch.device("meta"):
        model = GPT(mc)
    model = model.to_empty(device="cpu")
    if mc.tie_embeddings:
        model.lm_head.weight = model.wte.weight
    model.reset_rope()
    return model


def prepare_model(model: torch.nn.Module, fc: FinetuneConfig, device: torch.device | str = "cpu",
                  precision: str = "fp32", quantize: bool = True, progress: bool = False) -> list[str]:
    """Make `model` trainable as `fc.method` asks: LoRA adapters on a frozen base (lora), the
    same on a 4-bit base (qlora: quantized on `device`, or with quantize=False only allocated for
    a checkpoint to fill), or every parameter trainable (full). Returns the adapted module names
    ([] for full)."""
    if fc.method == "full":
        for p in model.parameters():
            p.requires_grad_(True)
        return []
    if fc.method == "qlora":
        from gptforge.model.qlora import apply_qlora

        return apply_qlora(model, lora_config(fc), quant_config(fc, precision), device, quantize=quantize,
                           progress=progress)
    return apply_lora(model, lora_config(fc))


# ---------------------------------------------------------------------------------------------
# Run directory


def write_export_inputs(run_dir: Path, source: dict, chat_template: Path | None = None) -> None:
    """Copy the tokenizer files and write hf_config.json / generation_config.json into run_dir."""
    from gptforge.model.hf_save import TOKENIZER_FILES

    run_dir.mkdir(parents=True, exist_ok=True)
    tok_dir = source.get("tokenizer_dir")
    if tok_dir is not None:
        for name in TOKENIZER_FILES:
            if (Path(tok_dir) / name).is_file() and Path(tok_dir).resolve() != run_dir.resolve():
                atomic_copy(Path(tok_dir) / name, run_dir / name)
    if chat_template is not None:
        atomic_copy(chat_template, run_dir / "chat_template.jinja")
    if source.get("hf_config") is not None:
        atomic_write_text(run_dir / "hf_config.json", json.dumps(source["hf_config"], indent=2) + "\n")
    if source.get("generation_config") is not None:
        atomic_write_text(run_dir / "generation_config.json", json.dumps(source["generation_config"], indent=2) + "\n")


def write_builtin_template(run_dir: Path, tok, fc: FinetuneConfig) -> None:
    """Write the built-in instruction format as run_dir/chat_template.jinja
    (`gptforge.data.chat.default_chat_template`) when this run trains with it
    (finetune.chat_template default, or auto with a tokenizer that has no template), so that the
    hf, gguf, onnx and Triton exports and `serve` carry the format the model learned."""
    from gptforge.data.chat import default_chat_template

    if fc.chat_template == "default" or (fc.chat_template == "auto" and not tok.chat_template):
        atomic_write_text(run_dir / "chat_template.jinja", default_chat_template(tok.add_bos))


def load_chat_tokenizer(folder: Path, chat_template: Path | None = None):
    """ChatTokenizer of the model's tokenizer folder, with a custom template file if given."""
    from gptforge.data.chat import ChatTokenizer

    tok = ChatTokenizer.from_dir(folder)
    if chat_template is not None:
        tok.chat_template = chat_template.read_text()
    return tok


# ---------------------------------------------------------------------------------------------
# The run


def finetune(fc: FinetuneConfig, cfg: RunConfig, source: str | Path | None, data: str | Path, run_dir: str | Path,
        resume: bool = False, progress: bool = True, log=None):
    """Fine-tune `source` (a Hugging Face folder or a gptforge run) on `data` (instruction .jsonl or a
    shard folder) into `run_dir`; returns the TrainResult. `cfg.model` is ignored: the model is
    the source's.

    Raises:
        FileNotFoundError: missing source, data, tokenizer, or nothing to resume.
        ValueError: a bad config or data that does not fit the model (the message names it).
    """
    import os

    from gptforge.config import to_dict
    from gptforge.runtime.adapters import save_adapter_from_checkpoint
    from gptforge.runtime.checkpoint import find_checkpoint
    from gptforge.runtime.device import pick_device, resolve_precision
    from gptforge.train.optim import finetune_lr_defaults
    from gptforge.train.run import train

    say = log or (lambda m: None)
    run_dir, data = Path(run_dir), Path(data)
    device = pick_device(cfg.train.device)
    precision = resolve_precision(cfg.train.precision, device, say)  # auto: decided once, here
    cfg = RunConfig(model=cfg.model, train=dataclasses.replace(cfg.train, precision=precision), parallel=cfg.parallel)
    check_method(fc, device, cfg.train.precision, cfg.parallel)
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

    model, mc, tok_dir, source = _base_model(run_dir, source, resume, chat_template, say)
    cfg = RunConfig(model=cfg.model, train=finetune_lr_defaults(cfg.train, fc.method, mc.d_model), parallel=cfg.parallel)
    seq_len = seq_len_for(fc, mc.block_size)
    if data.is_file():
        if tok_dir is None:
            raise FileNotFoundError(f"{source}: no tokenizer.json beside the model; instruction data needs the "
                                    "model's tokenizer")
        tok = load_chat_tokenizer(Path(tok_dir), chat_template if not resume else None)
        if not resume and int(os.environ.get("RANK", "0")) == 0:
            write_builtin_template(run_dir, tok, fc)
        source_data: BatchSource = InstructionData(data, tok, seq_len, fc, cfg.train.seed)
    else:
        tok_json = Path(tok_dir) / "tokenizer.json" if tok_dir is not None else None
        source_data = ShardSource(data, seq_len, cfg.train.eval_steps, cfg.train.micro_batch_size,
                                  tok_json if tok_json is not None and tok_json.is_file() else None)

    def model_factory(_mc):
        m = empty_model(mc) if model is None else model
        # On resume the 4-bit base comes from the checkpoint: allocate it, do not quantize garbage.
        prepare_model(m, fc, device, cfg.train.precision, quantize=model is not None, progress=progress)
        return m

    base = str(Path(source).resolve()) if source is not None else None
    extra = {"finetune": to_dict(fc), "base_model": {"path": base}}
    lora = fc.method != "full"

    def save_adapter(step: int, path: Path) -> None:
        save_adapter_from_checkpoint(path, path / ADAPTER_DIR, base)

    on_save = save_adapter if lora else None
    say(f"fine-tuning ({fc.method}) at sequence length {seq_len}")
    result = train(RunConfig(model=mc, train=cfg.train, parallel=cfg.parallel), data, run_dir, resume=resume,
                   progress=progress, log=log, model_factory=model_factory, data=source_data,
                   config_extra=extra, on_save=on_save)
    if lora and int(os.environ.get("RANK", "0")) == 0:
        save_adapter_from_checkpoint(find_checkpoint(run_dir), run_dir / ADAPTER_DIR, base)
    return result


def _base_model(run_dir: Path, source, resume: bool, chat_template: Path | None, say):
    """(pretrained model or None on resume, its resolved ModelConfig, tokenizer folder or None,
    the source path) for `finetune`; a new run also gets the source's export inputs."""
    import torch

    from gptforge.config import from_dict
    from gptforge.runtime.checkpoint import find_checkpoint
    from gptforge.runtime.loading import load_pretrained

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
            write_export_inputs(run_dir, src, chat_template)
        tok_dir = run_dir if (run_dir / "tokenizer.json").is_file() else tok_dir

    return model, mc, tok_dir, source
