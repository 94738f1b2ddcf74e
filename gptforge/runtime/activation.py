"""Activation checkpointing of a model's transformer blocks (applied from outside the model)."""

from __future__ import annotations

import contextlib
from typing import cast

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    checkpoint_wrapper,
)


def apply_activation_checkpointing(model: nn.Module, mode: str, preserve_rng_state: bool = True) -> None:
    """Recompute block activations in backward.

    - "full": every transformer block is wrapped: only block inputs are kept, (B, T, C) per layer.
    - "selective": every other block is wrapped (torchtitan's per-layer selective AC), halving the
      saved activations for about a third of full recompute's extra forward cost.
    - "none": nothing.
    Non-reentrant checkpointing (torch.utils.checkpoint, use_reentrant=False) keeps RNG state, so
    dropout masks match between the forward and the recompute. `model.blocks` may be the GPT's
    ModuleList or a pipeline stage's ModuleDict keyed by the original layer index.
    `preserve_rng_state=False` is for fake-tensor runs (the planner's --measure), which have no RNG.
    The recomputation runs the linear layers as the forward did: inside
    `gptforge.runtime.onednn_linear.onednn_linear` when the forward was (torch's checkpoint compares
    the tensors each saves).
    """
    if mode == "none":
        return
    if mode not in ("full", "selective"):
        raise ValueError(f"train.activation_checkpointing: unknown mode {mode!r} (none, selective, full)")
    for name, block in list(cast(nn.Module, model.blocks).named_children()):
        if mode == "full" or int(name) % 2 == 0:
            setattr(model.blocks, name, checkpoint_wrapper(block, preserve_rng_state=preserve_rng_state,
                                                           context_fn=_recompute_as_forward))


def _recompute_as_forward() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """torch.utils.checkpoint's context_fn: (forward context, recomputation context)."""
    from gptforge.runtime.onednn_linear import onednn_linear, onednn_linear_active

    return contextlib.nullcontext(), onednn_linear(onednn_linear_active())
