"""Supervised fine-tuning loss over the tokens that count (completion tokens of instruction data)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100  # same value as gptforge.data.instruct.IGNORE_INDEX (F.cross_entropy's default)


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of next-token cross-entropies in nats, number of counted tokens) over labels != -100.

    logits: (B, T, V) for already-shifted labels (B, T). Computed in fp32. The caller divides the
    summed loss of a whole optimizer step by its total count, so that gradient accumulation
    weights every counted token equally (not every micro-batch).
    """
    loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
    return loss, (labels != IGNORE_INDEX).sum()


def masked_mean_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over counted tokens; exactly 0 (not NaN) when no token counts.

    A batch whose completions were all truncated away thus adds nothing, and its gradient is zero.
    """
    total, count = token_loss_sum(logits, labels)
    return total / count.clamp(min=1)
