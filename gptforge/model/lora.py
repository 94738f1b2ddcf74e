"""LoRA: low-rank adapters on the GPT's linear layers (Hu et al. 2021, "LoRA", section 4.1).

A target `nn.Linear` with weight W (out, in) computes  y = x W^T + b + (alpha / r) * dropout(x) A^T B^T,
A (r, in) and B (out, r) the only trained tensors. A starts Kaiming-uniform (as nn.Linear and
PEFT initialise it), B at zero, so training starts from the base model exactly.

Why our own ~200 lines rather than PEFT's `get_peft_model`: the adapted layer stays an `nn.Linear`
at the same path with the same `weight`/`bias` names, so gptforge checkpoints, the Hugging Face
converter and the outside-in parallelisation (FSDP2/TP in train/parallelize) see the model they
know; PEFT would wrap the model and rename every parameter, and would make transformers a
training dependency. PEFT users still get PEFT's format: `save_peft_adapter` writes
`adapter_config.json` + `adapter_model.safetensors` under the Hugging Face module names, which
`peft.PeftModel.from_pretrained(hf_model, dir)` loads (tested against peft).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptforge.atomic import atomic_write_text, replace_dir
from gptforge.config import ModelConfig

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Linear layers of a gptforge block that can carry an adapter (gate_proj: llama arch only)."""


@dataclass
class LoRAConfig:
    """Low-rank adapters for fine-tuning (Hu et al. 2021)."""

    rank: int = 8
    """Adapter rank r."""
    alpha: float = 16.0
    """Scale numerator: the adapter's output is multiplied by alpha / rank."""
    dropout: float = 0.0
    """Dropout on the adapter's input (training only)."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Block linears to adapt: any of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj,
    or "all"."""

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def targets(self) -> list[str]:
        """The validated target list ("all" expanded).

        Raises:
            ValueError: an unknown target name, or rank < 1.
        """
        if self.rank < 1:
            raise ValueError(f"lora.rank must be >= 1, got {self.rank}")
        names = list(LORA_TARGETS) if list(self.target_modules) == ["all"] else list(self.target_modules)
        bad = [n for n in names if n not in LORA_TARGETS]
        if bad or not names:
            raise ValueError(f"lora.target_modules: unknown {bad or names}; choose from {', '.join(LORA_TARGETS)} or all")
        return names


class LoRALinear(nn.Linear):
    """nn.Linear plus a low-rank update. Same `weight`/`bias` as the layer it replaces.

    forward: x (..., in) -> (..., out) = linear(x) + scaling * (dropout(x) @ A^T) @ B^T.
    Parameters lora_A (r, in), lora_B (out, r).
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0):
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        for attr in ("is_residual_proj",):
            if hasattr(base, attr):
                setattr(self, attr, getattr(base, attr))
        kw: dict[str, Any] = dict(device=base.weight.device, dtype=base.weight.dtype)
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, **kw))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, **kw))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scaling = alpha / rank
        self.lora_dropout = nn.Dropout(dropout)

    adapter_enabled: bool = True
    """False inside `adapters_disabled`: the layer is its base linear alone."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias)
        if not self.adapter_enabled:
            return out
        return out + F.linear(F.linear(self.lora_dropout(x), self.lora_A), self.lora_B) * self.scaling

    def delta_weight(self) -> torch.Tensor:
        """scaling * B @ A, shape (out, in): what merging adds to `weight`."""
        return (self.lora_B.float() @ self.lora_A.float()) * self.scaling

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.lora_A.shape[0]}, scaling={self.scaling:g}"


def apply_lora(model: nn.Module, cfg: LoRAConfig) -> list[str]:
    """Replace the target linears of every block by `LoRALinear` and freeze everything else.

    After this only `lora_A`/`lora_B` parameters have requires_grad. Returns the adapted module
    names (e.g. "blocks.0.attn.q_proj").

    Raises:
        ValueError: invalid config (see `LoRAConfig.targets`), a model already adapted, or no
            module matched (e.g. gate_proj on a gpt2-arch model).
    """
    targets = set(cfg.targets())
    if any(isinstance(m, LoRALinear) for m in model.modules()):
        raise ValueError("model already has LoRA adapters; merge_lora() first")
    for p in model.parameters():
        p.requires_grad_(False)
    done = []
    for name, module in list(model.named_modules()):
        leaf = name.rsplit(".", 1)[-1]
        if leaf in targets and isinstance(module, nn.Linear) and name.startswith("blocks."):
            parent = model.get_submodule(name.rsplit(".", 1)[0])
            setattr(parent, leaf, LoRALinear(module, cfg.rank, cfg.alpha, cfg.dropout))
            done.append(name)
    if not done:
        raise ValueError(f"lora.target_modules {sorted(targets)} matched no linear layer of this model")
    return done


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, every LoRA layer of `model` (LoRALinear, QLoRA's LoRALinear4bit) computes its
    base layer alone: the model is the frozen base it was adapted from (a DPO reference at no extra
    memory, as PEFT's `disable_adapter`). The adapters are back on when the block ends."""
    layers: list[Any] = [m for m in model.modules() if isinstance(getattr(m, "lora_A", None), nn.Parameter)]
    for m in layers:
        m.adapter_enabled = False
    try:
        yield model
    finally:
        for m in layers:
            m.adapter_enabled = True


def lora_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """{name: parameter} of every adapter tensor (names end in lora_A / lora_B)."""
    return {n: p for n, p in model.named_parameters() if n.endswith(("lora_A", "lora_B"))}


@torch.no_grad()
def merge_lora(model: nn.Module) -> int:
    """Fold every adapter into its base weight (W += scaling * B @ A) and restore plain nn.Linear.

    Returns the number of merged layers. The merged model computes what the adapted one did
    (up to rounding in the weight dtype) and has the base model's state-dict names, ready for
    `gptforge.model.hf_save.save_hf`. Parameters become trainable again (requires_grad=True).
    """
    n = 0
    for name, module in list(model.named_modules()):
        if isinstance(module, LoRALinear):
            module.weight.add_(module.delta_weight().to(module.weight.dtype))
            plain = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None, device="meta")
            plain.weight, plain.bias = module.weight, module.bias
            if hasattr(module, "is_residual_proj"):
                plain.is_residual_proj = module.is_residual_proj
            parent_name, leaf = name.rsplit(".", 1)
            setattr(model.get_submodule(parent_name), leaf, plain)
            n += 1
    for p in model.parameters():
        p.requires_grad_(True)
    return n


# ---------------------------------------------------------------------------------------------
# PEFT adapter format

_PEFT_PREFIX = "base_model.model."
_LLAMA_MODULES = {
    "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
    "down_proj": "mlp.down_proj",
}
_GPT2_MODULES = {"o_proj": "attn.c_proj", "up_proj": "mlp.c_fc", "down_proj": "mlp.c_proj"}


def peft_adapter_state(model: nn.Module, model_cfg: ModelConfig) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors under PEFT names, adapter_config fields that depend on the model).

    Llama family: `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`, ...
    GPT-2: Hugging Face fuses q/k/v into the Conv1D `c_attn`; adapters on a subset S of q/k/v are
    written as one adapter of rank r*|S| with A = [A_q; A_k; A_v] and B block-diagonal, whose
    product B @ A is exactly the three separate updates stacked (alpha scaled by |S| via
    `alpha_pattern` so that alpha/rank is unchanged). `fan_in_fan_out` is set for Conv1D.

    Raises:
        ValueError: the model has no adapters, or adapters with different ranks/scalings.
    """
    cfg = model_cfg.resolved()
    # LoRALinear, or any layer carrying the same adapters (qlora.LoRALinear4bit).
    layers = {n: m for n, m in model.named_modules() if isinstance(getattr(m, "lora_A", None), nn.Parameter)}
    if not layers:
        raise ValueError("model has no LoRA adapters (apply_lora first)")
    ranks = {m.lora_A.shape[0] for m in layers.values()}
    scalings = {m.scaling for m in layers.values()}
    if len(ranks) != 1 or len(scalings) != 1:
        raise ValueError(f"adapters of mixed rank {ranks} / scaling {scalings} cannot be written as one PEFT config")
    rank, scaling = ranks.pop(), scalings.pop()
    out: dict[str, torch.Tensor] = {}
    targets: set[str] = set()
    extra: dict = {"fan_in_fan_out": False, "rank_pattern": {}, "alpha_pattern": {}}
    if cfg.arch != "gpt2":
        for name, m in layers.items():
            _, i, _, leaf = name.split(".")  # blocks.{i}.{attn|mlp}.{leaf}
            hf = f"{_PEFT_PREFIX}model.layers.{i}.{_LLAMA_MODULES[leaf]}"
            out[hf + ".lora_A.weight"] = m.lora_A.detach()
            out[hf + ".lora_B.weight"] = m.lora_B.detach()
            targets.add(leaf)
    else:
        extra["fan_in_fan_out"] = True
        hd, groups = cfg.head_dim, cfg.n_head // cfg.n_kv_head
        fused_width = 0
        for i in range(cfg.n_layer):
            blk = f"blocks.{i}."
            parts = [(p, layers.get(blk + f"attn.{p}")) for p in ("q_proj", "k_proj", "v_proj")]
            if any(m is not None for _, m in parts):
                As: list[torch.Tensor] = []
                Bs: list[torch.Tensor] = []
                for p, m in parts:
                    width = cfg.d_model  # every head is a full head in HF GPT-2
                    if m is None:
                        Bs.append(None)
                        continue
                    B = m.lora_B.detach()
                    if p != "q_proj" and groups > 1:  # GQA: HF GPT-2 has full K/V heads
                        B = B.view(cfg.n_kv_head, hd, rank).repeat_interleave(groups, 0).reshape(width, rank)
                    As.append(m.lora_A.detach())
                    Bs.append(B)
                k = len(As)
                fused_width = k * rank
                A = torch.cat(As, 0)
                B = torch.zeros(3 * cfg.d_model, k * rank, dtype=A.dtype)
                col = 0
                for j, b in enumerate(Bs):
                    if b is not None:
                        B[j * cfg.d_model:(j + 1) * cfg.d_model, col:col + rank] = b
                        col += rank
                hf = f"{_PEFT_PREFIX}transformer.h.{i}.attn.c_attn"
                out[hf + ".lora_A.weight"] = A
                out[hf + ".lora_B.weight"] = B
                targets.add("attn.c_attn")
            for leaf, hf_leaf in _GPT2_MODULES.items():
                m = layers.get(blk + ("attn." if leaf == "o_proj" else "mlp.") + leaf)
                if m is not None:
                    hf = f"{_PEFT_PREFIX}transformer.h.{i}.{hf_leaf}"
                    out[hf + ".lora_A.weight"] = m.lora_A.detach()
                    out[hf + ".lora_B.weight"] = m.lora_B.detach()
                    targets.add(hf_leaf)
        if fused_width and fused_width != rank:
            extra["rank_pattern"] = {"c_attn": fused_width}
            extra["alpha_pattern"] = {"c_attn": scaling * fused_width}
    extra["target_modules"] = sorted(targets)
    extra["r"] = rank
    extra["lora_alpha"] = scaling * rank
    return {k: v.contiguous() for k, v in out.items()}, extra


def save_peft_adapter(model: nn.Module, model_cfg: ModelConfig, lora_cfg: LoRAConfig, out_dir: str | Path,
                      base_model_name_or_path: str | None = None, dtype: torch.dtype | None = None) -> Path:
    """Write the adapters in PEFT's format: adapter_config.json + adapter_model.safetensors.

    The names are those of the Hugging Face model that `gptforge.model.hf_save.save_hf` writes for
    `model_cfg` (or that the model was converted from), so
    `PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), out_dir)` loads them.
    The folder is written under a temporary name and renamed into place.

    Raises:
        ValueError: see `peft_adapter_state`.
    """
    from safetensors.torch import save_file

    tensors, fields = peft_adapter_state(model, model_cfg)
    if dtype is not None:
        tensors = {k: v.to(dtype) for k, v in tensors.items()}
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model_name_or_path,
        "lora_dropout": lora_cfg.dropout, "bias": "none", "inference_mode": True, "init_lora_weights": True,
        "modules_to_save": None, "use_rslora": False, "use_dora": False, "layers_to_transform": None,
        "layers_pattern": None, "revision": None, **fields,
    }
    out_dir = Path(out_dir)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save_file({k: v.cpu() for k, v in tensors.items()}, str(tmp / "adapter_model.safetensors"),
                  metadata={"format": "pt"})
        atomic_write_text(tmp / "adapter_config.json", json.dumps(config, indent=2, sort_keys=True))
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
