"""LoRA / QLoRA adapters inside a training checkpoint: find them, read them, merge them.

A fine-tuning checkpoint holds the base weights plus `*.lora_A` / `*.lora_B` tensors (and, for
QLoRA, the 4-bit base as `*.weight_4bit` with its quantization state); the adapters' rank and
alpha are in config.yaml's `finetune` section. Inference and export load such a checkpoint into
a plain GPT with the adapters merged (W += alpha/r * B @ A, after dequantizing a 4-bit base).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import yaml

from gptforge.config import ModelConfig, from_dict
from gptforge.model.lora import LoRAConfig, apply_lora, merge_lora, save_peft_adapter
from gptforge.model.qlora import QuantConfig


def _checkpoint_doc(step: Path) -> dict:
    f = next((p / "config.yaml" for p in (step, step.parent.parent) if (p / "config.yaml").is_file()), None)
    if f is None:
        raise FileNotFoundError(f"{step}: no config.yaml in the checkpoint or its run directory")
    return yaml.safe_load(f.read_text()) or {}


def checkpoint_lora(step: Path, keys) -> LoRAConfig | None:
    """The LoRAConfig a checkpoint was trained with, from its tensor names (`keys`, as in DCP's
    metadata) and config.yaml's `finetune` section; None when it holds no adapters.

    Raises:
        ValueError: adapters but no finetune.lora_alpha in config.yaml.
    """
    targets = sorted({k.split(".")[-2] for k in keys if k.endswith(".lora_A")})
    if not targets:
        return None
    ft = _checkpoint_doc(step).get("finetune") or {}
    if "lora_alpha" not in ft or "lora_rank" not in ft:
        raise ValueError(f"{step}: the checkpoint has LoRA adapters but its config.yaml has no finetune.lora_rank/"
                         "lora_alpha to scale them")
    return LoRAConfig(rank=int(ft["lora_rank"]), alpha=float(ft["lora_alpha"]),
                      dropout=float(ft.get("lora_dropout", 0.0)), target_modules=targets)


def _read_tensors(step: Path, names: dict[str, tuple]) -> dict[str, torch.Tensor]:
    """Load the named flat DCP tensors (name -> (shape, dtype)) in this process alone."""
    import torch.distributed.checkpoint as dcp

    out = {k: torch.empty(shape, dtype=dtype) for k, (shape, dtype) in names.items()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed.*")
        dcp.load(out, checkpoint_id=str(step), no_dist=True)
    return out


def save_adapter_from_checkpoint(step: Path, out_dir: Path, base_model: str | None = None) -> Path:
    """Write the LoRA adapters of checkpoint folder `step` in PEFT's format at `out_dir`.

    Reads only the adapter tensors (any layout wrote them: DCP reshards). The names are those of
    the Hugging Face model `convert --to-hf` writes for the base, so
    `PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE), out_dir)` loads them.

    Raises:
        ValueError: the checkpoint holds no adapters.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from gptforge.model.gpt import GPT

    step = Path(step)
    meta = dcp.FileSystemReader(str(step)).read_metadata().state_dict_metadata
    lc = checkpoint_lora(step, meta)
    if lc is None:
        raise ValueError(f"{step}: no LoRA adapters in this checkpoint (a full fine-tune: use convert --to-hf)")
    doc = _checkpoint_doc(step)
    mc = from_dict(ModelConfig, {k: v for k, v in doc["model"].items() if v is not None}, "model.").resolved()
    wanted = {k: (tuple(v.size), v.properties.dtype) for k, v in meta.items()
              if k.endswith((".lora_A", ".lora_B")) and isinstance(v, TensorStorageMetadata)}
    tensors = _read_tensors(step, wanted)
    prefix = next(k[: k.index("blocks.")] for k in tensors)
    with torch.device("meta"):
        model = GPT(mc)
    apply_lora(model, lc)
    model.load_state_dict({k[len(prefix):]: v for k, v in tensors.items()}, strict=False, assign=True)
    return save_peft_adapter(model, mc, lc, out_dir, base_model_name_or_path=base_model)


def checkpoint_quant(step: Path, keys) -> tuple[QuantConfig, list[str]] | None:
    """(QuantConfig, names of the 4-bit layers) of a QLoRA checkpoint, from its tensor names
    (`keys`) and config.yaml's `finetune` section; None when it holds no 4-bit weights."""
    names = sorted(k[: -len(".weight_4bit")] for k in keys if k.endswith(".weight_4bit"))
    if not names:
        return None
    ft = _checkpoint_doc(step).get("finetune") or {}
    qcfg = QuantConfig(quant_type=ft.get("qlora_quant_type", "nf4"),
                       double_quant=any(k.endswith(".weight_nested_absmax") for k in keys))
    return qcfg, names


def load_lora_for_export(model: torch.nn.Module, step: Path, keys) -> int:
    """Prepare a base `model` to receive a LoRA or QLoRA checkpoint's tensors: add adapters
    shaped as the checkpoint's (`keys`: its tensor names), and for QLoRA allocate the 4-bit
    layers it holds. Returns the number of adapted layers (0: none). Call
    `merge_for_export(model)` after loading the weights.

    Raises:
        QLoRAUnavailable: a QLoRA checkpoint without bitsandbytes installed (needed to dequantize).
    """
    lc = checkpoint_lora(step, keys)
    if lc is None:
        return 0
    quant = checkpoint_quant(step, keys)
    if quant is None:
        return len(apply_lora(model, lc))
    from gptforge.model.qlora import apply_qlora, import_bitsandbytes

    import_bitsandbytes()
    qcfg, names = quant
    return len(apply_qlora(model, lc, qcfg, quantize=False, modules=names))


def merge_for_export(model: torch.nn.Module) -> int:
    """Dequantize any 4-bit layers (QLoRA) and fold every adapter into its weight; returns the
    number of merged layers. The result is a plain GPT with the base model's tensor names."""
    from gptforge.model.qlora import dequantize_model

    dequantize_model(model)
    return merge_lora(model)
