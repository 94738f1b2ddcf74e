"""Distillation as an `Objective`: a student learns a frozen teacher's next-token distribution.

Loss per target token (Hinton, Vinyals and Dean 2015, "Distilling the Knowledge in a Neural
Network", section 2; forward KL as Minitron, Muralidharan et al. 2024, arXiv 2407.14679 / 2408.11796):

    loss = T^2 * KL(p_teacher^T || p_student^T) + alpha * CE(student, target)

where p^T = softmax(logits / T). The T^2 factor keeps the soft term's gradients at the same
scale whatever the temperature (Hinton et al., end of section 2). Tokens whose target is -100
count for nothing in either term, as in `gptforge.runtime.loss.token_loss_sum`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from gptforge.errors import InputError
from gptforge.runtime.loss import IGNORE_INDEX, unpack_micro_batch
from gptforge.train.objectives.base import Forward, ObjectiveBase, ObjectiveLoss


@dataclass
class DistillTerms:
    """Summed terms over the counted tokens (0-dim fp32 tensors) and their count."""

    loss: torch.Tensor
    """T^2 * kl + alpha * ce (what backward runs on)."""
    kl: torch.Tensor
    """Summed KL(teacher || student) at temperature T, in nats (without the T^2 factor)."""
    ce: torch.Tensor
    """Summed next-token cross-entropy of the student against the targets, in nats."""
    tokens: int
    """Number of targets != -100."""


def distill_loss_sum(student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor,
                     alpha: float = 0.0, temperature: float = 1.0) -> DistillTerms:
    """The distillation loss summed over the counted tokens (see the module docstring).

    student_logits, teacher_logits: (B, T, V), any float dtype (computed in fp32);
    targets: (B, T) int64, -100 = ignored. Divide `loss` by the step's token count, as the trainer
    does with `token_loss_sum`.

    Raises:
        InputError: shapes differ (a teacher with another vocabulary), temperature <= 0 or alpha < 0.
    """
    if student_logits.shape != teacher_logits.shape:
        raise InputError(f"student logits {tuple(student_logits.shape)} and teacher logits "
                         f"{tuple(teacher_logits.shape)} differ: teacher and student need the same vocabulary")
    if temperature <= 0:
        raise InputError(f"--temperature must be > 0, got {temperature}")
    if alpha < 0:
        raise InputError(f"--alpha must be >= 0, got {alpha}")
    V = student_logits.size(-1)
    s = student_logits.float().reshape(-1, V)
    t = teacher_logits.detach().float().reshape(-1, V)
    y = targets.reshape(-1)
    keep = y != IGNORE_INDEX
    log_ps = F.log_softmax(s[keep] / temperature, dim=-1)
    log_pt = F.log_softmax(t[keep] / temperature, dim=-1)
    # KL(pt || ps) = sum pt (log pt - log ps), summed over tokens.
    kl = F.kl_div(log_ps, log_pt, log_target=True, reduction="sum")
    ce = F.cross_entropy(s, y, ignore_index=IGNORE_INDEX, reduction="sum")
    return DistillTerms(loss=temperature**2 * kl + alpha * ce, kl=kl, ce=ce, tokens=int(keep.sum()))


def distill_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor,
                 alpha: float = 0.0, temperature: float = 1.0) -> torch.Tensor:
    """Mean per counted token of `distill_loss_sum(...).loss`: a 0-dim fp32 tensor.

    student_logits, teacher_logits (B, T, V); targets (B, T) int64 (-100 ignored).
    """
    terms = distill_loss_sum(student_logits, teacher_logits, targets, alpha, temperature)
    return terms.loss / max(terms.tokens, 1)



class Distillation(ObjectiveBase):
    """`distill_loss_sum(...).loss` over the counted targets; unit: target tokens != -100.

    The teacher (`teacher(inputs, **extra)` -> logits (B, T, V) without gradients, e.g.
    gptforge.train.workflows.distill.Teacher, already on this rank's device) runs on the same
    inputs as the student, under the run's autocast. Metrics per counted token: `distill/kl`
    (KL(teacher || student) at temperature T, nats, without the T^2 factor) and `distill/ce`
    (the student's cross-entropy against the targets, nats). Not under pipeline parallelism
    (the teacher needs the inputs, which the last stage does not see); no divergence ceiling
    (the T^2-scaled KL has no ln V bound).

    Raises:
        InputError: temperature <= 0 or alpha < 0.
    """

    name = "distillation"
    unit = "tokens"
    metric_names = ("distill/kl", "distill/ce")

    def __init__(self, teacher: Callable[..., torch.Tensor], alpha: float, temperature: float):
        if temperature <= 0:
            raise InputError(f"--temperature must be > 0, got {temperature}")
        if alpha < 0:
            raise InputError(f"--alpha must be >= 0, got {alpha}")
        self.teacher, self.alpha, self.temperature = teacher, alpha, temperature

    def count(self, micro_batch: Any) -> int:
        return int((unpack_micro_batch(micro_batch)[1] != IGNORE_INDEX).sum())

    def loss(self, forward: Forward, micro_batch: Any) -> ObjectiveLoss:
        x, y, extra = unpack_micro_batch(micro_batch)
        logits = forward(x, **extra)
        with forward.autocast():
            teacher_logits = self.teacher(x, **extra)
        terms = distill_loss_sum(logits, teacher_logits, y, self.alpha, self.temperature)
        return ObjectiveLoss(terms.loss, {"distill/kl": (terms.kl.detach(), terms.tokens),
                                          "distill/ce": (terms.ce.detach(), terms.tokens)})
