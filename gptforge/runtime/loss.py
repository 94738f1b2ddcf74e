"""The next-token loss as training and evaluation count it, and micro-batch unpacking."""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100
"""Target id that counts for nothing (PyTorch's cross_entropy default ignore_index)."""


def token_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed next-token cross-entropy in nats over targets != -100, computed in fp32.

    logits: (B, T, V); targets: (B, T) int64. Returns a 0-dim fp32 tensor.
    """
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="sum")


def unpack_micro_batch(mb) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """(inputs (b, T), targets (b, T), extra model kwargs) of a micro-batch.

    A micro-batch is a pair (inputs, targets), or a dict as `gptforge.data.instruct` makes them:
    input_ids, labels, and optional position_ids (b, T) / attn_mask (b, 1, T, T) bool that are
    passed to the model as keyword arguments (packed sequences).
    """
    if isinstance(mb, dict):
        extra = {k: mb[k] for k in ("position_ids", "attn_mask") if mb.get(k) is not None}
        return mb["input_ids"], mb["labels"], extra
    x, y = mb
    return x, y, {}


def count_targets(micro_batches: list) -> int:
    """Number of target tokens that count (!= -100) over all micro-batches of one optimizer step."""
    return sum(int((unpack_micro_batch(mb)[1] != IGNORE_INDEX).sum()) for mb in micro_batches)
