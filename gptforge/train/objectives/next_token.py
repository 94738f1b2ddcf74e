"""Next-token cross-entropy summed over the targets that count: pretraining and completion-only SFT.

Completion-only SFT is this objective on instruction data whose prompt targets are -100
(gptforge.train.sources.instruction): only completion tokens count, in the loss and in the
step's token count alike. Runs under pipeline parallelism (the loss needs only logits and targets).
"""

from __future__ import annotations

from typing import Any

import torch

from gptforge.runtime.loss import IGNORE_INDEX, token_loss_sum, unpack_micro_batch
from gptforge.train.objectives.base import Forward, ObjectiveBase, ObjectiveLoss
from gptforge.train.spikes import divergence_loss_ceiling


class NextToken(ObjectiveBase):
    """sum over counted targets of -log p(target | prefix), in nats; unit: target tokens != -100.

    A micro-batch is (inputs (b, T), targets (b, T)) int64 or a dict (input_ids, labels, optional
    position_ids / attn_mask; see `gptforge.runtime.loss.unpack_micro_batch`).
    """

    name = "next-token loss"
    unit = "tokens"
    supports_pipeline = True

    def loss_ceiling(self, vocab_size: int) -> float | None:
        """ln V + margin (gptforge.train.spikes.divergence_loss_ceiling): a uniform guess scores ln V."""
        return divergence_loss_ceiling(vocab_size)

    def count(self, micro_batch: Any) -> int:
        return int((unpack_micro_batch(micro_batch)[1] != IGNORE_INDEX).sum())

    def loss(self, forward: Forward, micro_batch: Any) -> ObjectiveLoss:
        x, y, extra = unpack_micro_batch(micro_batch)
        return ObjectiveLoss(token_loss_sum(forward(x, **extra), y))

    def pipeline_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return token_loss_sum(logits, targets)
