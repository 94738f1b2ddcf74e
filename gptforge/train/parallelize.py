"""Wrappers applied to the model from outside: activation checkpointing, torch.compile.

Order, as in torchtitan: (pipeline split, tensor parallel,) activation checkpointing, compile,
(data-parallel wrapping). The model module itself stays unaware of all of these.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper


def apply_activation_checkpointing(model: nn.Module, mode: str) -> None:
    """Recompute block activations in backward.

    - "full": every transformer block is wrapped: only block inputs are kept, (B, T, C) per layer.
    - "selective": every other block is wrapped (torchtitan's per-layer selective AC), halving the
      saved activations for about a third of full recompute's extra forward cost.
    - "none": nothing.
    Non-reentrant checkpointing (torch.utils.checkpoint, use_reentrant=False) keeps RNG state, so
    dropout masks match between the forward and the recompute.
    """
    if mode == "none":
        return
    if mode not in ("full", "selective"):
        raise ValueError(f"train.activation_checkpointing: unknown mode {mode!r} (none, selective, full)")
    blocks = model.blocks
    for i in range(len(blocks)):
        if mode == "full" or i % 2 == 0:
            blocks[i] = checkpoint_wrapper(blocks[i], preserve_rng_state=True)


def apply_compile(model: nn.Module) -> nn.Module:
    """Compile each block separately (fast to compile; repeated structure is reused)."""
    for i in range(len(model.blocks)):
        model.blocks[i] = torch.compile(model.blocks[i])
    return model
