"""The policy-gradient objective of `gptforge rl` (GRPO / DAPO), as the trainer's `Objective`.

A micro-batch is a dict of rollout rows (`gptforge.train.rl.batch.rollout_rows`: input_ids,
loss_mask, old_logprobs, ref_logprobs, advantages). Its unit is the counted completion tokens
(rl.loss_unit token, DAPO) or the completions with a counted token (sequence, GRPO), read from
loss_mask before the forward (`loss_count`); its loss is `policy_loss`'s sum, so the trainer's
division by the step's global count gives the loss of the whole mini-batch on every layout.
Metrics (per unit): clip_low, clip_high (shares of clipped tokens), ratio, entropy, and kl when
rl.kl_beta > 0 (the reference log-probs ride in the rows, computed when the batch was sampled).
"""

from __future__ import annotations

from typing import Any

import torch

from gptforge.config.rl import RLConfig
from gptforge.train.objectives.base import Forward, ObjectiveBase, ObjectiveLoss
from gptforge.train.rl.loss import loss_count, policy_loss, token_logprobs


class PolicyGradient(ObjectiveBase):
    """GRPO / DAPO clipped policy-gradient loss (gptforge.train.rl.loss) over rollout rows."""

    name = "policy gradient (GRPO/DAPO)"

    def __init__(self, cfg: RLConfig):
        self.cfg = cfg
        self.unit = "tokens" if cfg.loss_unit == "token" else "sequences"
        names = ["rl/clip_low", "rl/clip_high", "rl/ratio", "rl/entropy"]
        self.metric_names = tuple(names + (["rl/kl"] if cfg.kl_beta else []))

    def count(self, micro_batch: Any) -> int:
        return int(loss_count(micro_batch["loss_mask"], self.cfg.loss_unit))

    def loss(self, forward: Forward, micro_batch: Any) -> ObjectiveLoss:
        c = self.cfg
        ids, mask = micro_batch["input_ids"], micro_batch["loss_mask"]
        logp, entropy = token_logprobs(forward(ids[:, :-1]), ids[:, 1:], c.temperature)
        out = policy_loss(logp, micro_batch["old_logprobs"], micro_batch["advantages"], mask, c.clip_low,
                          c.clip_high, c.loss_unit, c.kl_beta, micro_batch["ref_logprobs"] if c.kl_beta else None)
        m = mask.to(entropy.dtype)
        if c.loss_unit == "token":
            out.metrics["entropy"] = float((entropy * m).sum())
        else:
            out.metrics["entropy"] = float(((entropy * m).sum(1) / m.sum(1).clamp(min=1)).sum())
        metrics: dict[str, tuple[torch.Tensor | float, torch.Tensor | float]] = {
            f"rl/{k}": (v, out.count) for k, v in out.metrics.items() if f"rl/{k}" in self.metric_names}
        return ObjectiveLoss(out.loss_sum, metrics)
