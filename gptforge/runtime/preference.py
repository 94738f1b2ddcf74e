"""Preference losses (DPO and relatives) and the sequence log-probs they compare.

A pair batch (`gptforge.data.preference.PairDataset.batch`) holds b chosen rows then the b
rejected rows of the same pairs: input_ids / labels / targets (2b, T). The model's logits
(2b, T, V) give each row's summed log-probability of its completion tokens (`sequence_logps`);
`preference_loss` turns them into per-pair losses and TRL's rewards.

Losses (beta = `dpo_beta`; c, r = policy log-probs of the chosen / rejected completion summed over
its tokens; rc, rr the reference's; |c|, |r| the completion lengths in tokens):
- sigmoid (DPO, Rafailov et al. 2023, eq. 7): -log sigmoid(beta ((c - rc) - (r - rr)))
- ipo (Azar et al. 2023, eq. 17, length-normalised as TRL 1.16's DPOTrainer does):
  ((c - rc)/|c| - (r - rr)/|r| - 1/(2 beta))^2
- simpo (Meng et al. 2024, eq. 6; TRL's experimental CPOTrainer with loss_type="simpo"):
  -log sigmoid(beta (c/|c| - r/|r|) - gamma), reference-free
- orpo (Hong et al. 2024, eq. 7; TRL's experimental ORPOTrainer): with mean log-probs
  a = c/|c|, b = r/|r|, log odds = (a - b) - (log(1 - e^a) - log(1 - e^b)); per pair
  -beta log sigmoid(log odds), plus the chosen rows' mean next-token loss over prompt and
  completion (TRL's ORPO NLL term), reference-free.
`rpo_alpha` > 0 adds alpha times the chosen completions' mean next-token loss (RPO, Pang et al.
2024; TRL 1.16: loss_type=["sigmoid", "sft"], loss_weights=[1, rpo_alpha]).

Rewards (TRL's logged `rewards/*`): beta (c - rc) and beta (r - rr) for sigmoid/ipo; beta a and
beta b for simpo/orpo. `logps/chosen` is c (sigmoid/ipo) or a (simpo/orpo), as each TRL trainer logs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gptforge.runtime.loss import IGNORE_INDEX

LOSS_TYPES = ("sigmoid", "ipo", "simpo", "orpo")
REFERENCE_FREE = ("simpo", "orpo")
METRIC_NAMES = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
                "logps/chosen", "logps/rejected")


def token_logps(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-position log-probability of `targets` under `logits`, 0 where targets == -100.

    logits: (N, T, V) any float dtype (computed in fp32); targets: (N, T) int64. Returns (N, T) fp32.
    """
    flat = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="none")
    return -flat.view(targets.shape)


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed log-probs (N,) fp32, counted tokens (N,) fp32) of each row's labels != -100."""
    return token_logps(logits, labels).sum(-1), (labels != IGNORE_INDEX).sum(-1).float()


@torch.no_grad()
def pair_logps(model: torch.nn.Module, batch: dict, device: torch.device | str | None = None,
               autocast=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) summed completion log-probs (b,) fp32 of one pair batch, without grad.

    autocast: an optional context manager factory (e.g. `lambda: autocast_context(device, precision)`).
    """
    x = batch["input_ids"].to(device) if device is not None else batch["input_ids"]
    y = batch["labels"].to(x.device)
    if autocast is None:
        logits = model(x)
    else:
        with autocast():
            logits = model(x)
    logps, _ = sequence_logps(logits, y)
    chosen, rejected = logps.chunk(2)
    return chosen, rejected


@dataclass(frozen=True)
class PreferenceLoss:
    """A preference loss as TRL defines it (module docstring): `loss_type` one of LOSS_TYPES,
    `beta` > 0, `simpo_gamma` (SimPO's target margin), `rpo_alpha` >= 0 (weight of the chosen
    NLL term; not with orpo, which has its own)."""

    loss_type: str = "sigmoid"
    beta: float = 0.1
    simpo_gamma: float = 0.5
    rpo_alpha: float = 0.0

    def __post_init__(self):
        from gptforge.errors import OptionError  # a bad --finetune.dpo_* value: exit 2

        if self.loss_type not in LOSS_TYPES:
            raise OptionError(f"finetune.dpo_loss={self.loss_type!r}: choose one of {', '.join(LOSS_TYPES)}")
        if not (self.beta > 0 and math.isfinite(self.beta)):
            raise OptionError(f"finetune.dpo_beta={self.beta}: must be a finite number > 0 (TRL's default is 0.1)")
        if not (self.rpo_alpha >= 0 and math.isfinite(self.rpo_alpha)):
            raise OptionError(f"finetune.rpo_alpha={self.rpo_alpha}: must be a finite number >= 0 (0 = off)")
        if self.loss_type == "orpo" and self.rpo_alpha > 0:
            raise OptionError("finetune.rpo_alpha adds an NLL term ORPO already has; leave it at 0 with dpo_loss orpo")

    @property
    def needs_reference(self) -> bool:
        """Whether the loss compares with a reference model (sigmoid, ipo) or not (simpo, orpo)."""
        return self.loss_type not in REFERENCE_FREE

    def __call__(self, logits: torch.Tensor, batch: dict, ref_chosen: torch.Tensor | None = None,
                 ref_rejected: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(summed loss over the b pairs (0-dim fp32), per-pair metric tensors (b,)).

        logits: (2b, T, V) of the batch's input_ids; batch: labels / targets (2b, T);
        ref_chosen / ref_rejected: (b,) summed reference log-probs (sigmoid, ipo).
        Dividing the sum by b gives TRL's batch loss. Metrics: METRIC_NAMES, per pair.

        Raises:
            ValueError: sigmoid/ipo without reference log-probs.
        """
        per_token = token_logps(logits, batch["labels"].to(logits.device))
        counted = (batch["labels"] != IGNORE_INDEX).to(logits.device)
        logps, n_tokens = per_token.sum(-1), counted.sum(-1).float()
        chosen, rejected = logps.chunk(2)
        n_chosen, n_rejected = n_tokens.chunk(2)
        b = chosen.size(0)
        t = self.loss_type
        if t in REFERENCE_FREE:
            chosen, rejected = chosen / n_chosen.clamp(min=1), rejected / n_rejected.clamp(min=1)
            c_reward, r_reward = self.beta * chosen.detach(), self.beta * rejected.detach()
            if t == "simpo":
                losses = -F.logsigmoid(self.beta * (chosen - rejected - self.simpo_gamma / self.beta))
            else:
                log_odds = (chosen - rejected) - (_log1mexp(chosen) - _log1mexp(rejected))
                losses = -self.beta * F.logsigmoid(log_odds)
                losses = losses + self._chosen_nll(logits, batch["targets"].to(logits.device))
        else:
            if ref_chosen is None or ref_rejected is None:
                raise ValueError(f"dpo_loss {t} needs reference log-probs (a reference model or precomputed ones)")
            c_ratio, r_ratio = chosen - ref_chosen.to(chosen), rejected - ref_rejected.to(rejected)
            if t == "sigmoid":
                losses = -F.logsigmoid(self.beta * (c_ratio - r_ratio))
            else:
                delta = c_ratio / n_chosen.clamp(min=1) - r_ratio / n_rejected.clamp(min=1)
                losses = (delta - 1 / (2 * self.beta)) ** 2
            c_reward, r_reward = self.beta * c_ratio.detach(), self.beta * r_ratio.detach()
        if self.rpo_alpha > 0:
            chosen_tokens = counted[:b]
            nll = -(per_token[:b] * chosen_tokens).sum() / chosen_tokens.sum().clamp(min=1)
            losses = losses + self.rpo_alpha * nll
        metrics = {"rewards/chosen": c_reward, "rewards/rejected": r_reward,
                   "rewards/accuracies": (c_reward > r_reward).float(), "rewards/margins": c_reward - r_reward,
                   "logps/chosen": chosen.detach(), "logps/rejected": rejected.detach()}
        return losses.sum(), metrics

    @staticmethod
    def _chosen_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token loss of the chosen rows over prompt and completion tokens (TRL's ORPO)."""
        b = logits.size(0) // 2
        per_token = token_logps(logits[:b], targets[:b])
        counted = targets[:b] != IGNORE_INDEX
        return -per_token.sum() / counted.sum().clamp(min=1)


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - e^x) for x < 0, stable on both sides of -ln 2 (Maechler 2012)."""
    return torch.where(x < -math.log(2), torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))
