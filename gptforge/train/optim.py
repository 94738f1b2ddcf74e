"""Optimizer construction and learning-rate schedules."""

from __future__ import annotations

import math

import torch

from gptforge.config import TrainConfig


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: decay on matrices (dim >= 2: linear and embedding weights), none on
    biases and norm weights (dim < 2). Shared (tied) parameters appear once.

    Following Loshchilov & Hutter 2019 (decoupled weight decay) and the GPT-2/nanoGPT practice of
    not decaying gains and biases. A group with no parameter is left out.
    """
    decay, no_decay, seen = [], [], set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # An empty group (e.g. LoRA trains matrices only) would break DCP's optimizer state dict.
    return [g for g in groups if g["params"]]


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, device_type: str,
                    zero_group=None) -> torch.optim.Optimizer:
    """AdamW (fused kernel on CUDA and CPU where this torch has it) or SGD with momentum 0.9.

    zero_group: a data-parallel process group for ZeRO-1: the optimizer becomes a
    `torch.distributed.optim.ZeroRedundancyOptimizer` that keeps on each rank the states of its
    share of the parameters only (Rajbhandari et al. 2020, ZeRO, section 5.1, P_os), updates that
    share and broadcasts it. Its `.optim` is the local optimizer (what checkpoints save).

    Raises:
        ValueError: an optimizer that only the planner models (adamw8bit, adafactor).
    """
    groups = param_groups(model, cfg.weight_decay)
    if cfg.optimizer == "adamw":
        cls = torch.optim.AdamW
        kwargs = dict(lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
        # Fused AdamW runs one kernel for all parameters; DTensor parameters (FSDP2/TP) use foreach.
        is_dtensor = any(type(p).__name__ == "DTensor" for g in groups for p in g["params"])
        if device_type in ("cuda", "cpu") and not is_dtensor:
            kwargs["fused"] = True
    elif cfg.optimizer == "sgd":
        cls, kwargs = torch.optim.SGD, dict(lr=cfg.lr, momentum=0.9)
    else:
        cls = None
    if cls is not None:
        if zero_group is not None:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            return ZeroRedundancyOptimizer(groups, optimizer_class=cls, process_group=zero_group, **kwargs)
        return cls(groups, **kwargs)
    raise ValueError(
        f"train.optimizer={cfg.optimizer!r} is modelled by `gptforge plan` but not trainable here; use adamw or sgd"
    )


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step `step` (0-based).

    Linear warmup from lr/warmup_steps to lr over `warmup_steps`, then:
    - cosine: min_lr + (lr - min_lr) * (1 + cos(pi * progress)) / 2 (Loshchilov & Hutter 2017);
    - linear: straight line from lr to min_lr;
    - constant: lr;
    - wsd (warmup-stable-decay, Hu et al. 2024, MiniCPM): lr until the last `decay_fraction` of
      steps, then linear to min_lr.
    progress = (step - warmup) / (max_steps - warmup), clamped to [0, 1].
    """
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.max_steps - cfg.warmup_steps)
    progress = min(1.0, max(0.0, (step - cfg.warmup_steps) / span))
    if cfg.lr_schedule == "constant":
        return cfg.lr
    if cfg.lr_schedule == "cosine":
        return cfg.min_lr + (cfg.lr - cfg.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if cfg.lr_schedule == "linear":
        return cfg.lr + (cfg.min_lr - cfg.lr) * progress
    if cfg.lr_schedule == "wsd":
        decay_steps = max(1, int(round(cfg.decay_fraction * cfg.max_steps)))
        decay_start = cfg.max_steps - decay_steps
        if step < decay_start:
            return cfg.lr
        return cfg.lr + (cfg.min_lr - cfg.lr) * min(1.0, (step - decay_start + 1) / decay_steps)
    raise ValueError(f"train.lr_schedule: unknown schedule {cfg.lr_schedule!r}")
