"""The `rl.*` section: `gptforge rl`'s sampling, rewards and policy-gradient loss (`RLConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from gptforge.ranges import bounded, out_of_range


@dataclass
class RLConfig:
    """Reinforcement learning with verifiable rewards (GRPO / DAPO): what each step samples and how
    its loss is formed. One optimizer step = one mini-batch of a rollout batch."""

    samples_per_prompt: int = bounded(8, low=1)
    """Completions sampled per prompt (the group size G); group advantages need at least 2."""
    prompts_per_step: int = bounded(8, low=1)
    """Prompts per rollout batch (over all data-parallel ranks): each rollout batch holds
    prompts_per_step * samples_per_prompt completions."""
    max_new_tokens: int = bounded(256, low=1)
    """Completion budget in tokens; a completion that reaches it without EOS is cut (see overlong)."""
    temperature: float = bounded(1.0, low=0.0, low_open=True)
    """Sampling temperature; the loss's log-probabilities are taken at the same temperature."""
    top_p: float = bounded(1.0, low=0.0, high=1.0, low_open=True)
    """Nucleus sampling threshold (1: off)."""
    kl_beta: float = bounded(0.0, low=0.0)
    """Weight of the k3 KL penalty to the reference policy (the starting weights; with LoRA, the
    base with adapters off). 0 (default): no penalty and no reference model."""
    rewards: Optional[str] = None
    """YAML file of weighted rewards (`rewards: [{reward: SPEC, weight: W}, ...]`), instead of --reward."""
    eval_prompts: Optional[str] = None
    """Held-out prompt .jsonl: every train.eval_interval steps, one greedy completion each is
    scored (pass@1 = mean reward) and written with the prompts to RUN/samples/step_N.jsonl."""
    updates_per_batch: int = bounded(1, low=1)
    """Optimizer steps served by one rollout batch, each on a share of every group's completions
    (at most rl.samples_per_prompt). Above 1 the policy moves away from the sampling weights and
    the ratio clip acts."""
    clip_low: float = bounded(0.2, low=0.0, high=1.0, low_open=True)
    """eps_low of the ratio clip: ratios below 1 - clip_low stop pulling when the advantage is negative."""
    clip_high: float = bounded(0.28, low=0.0, low_open=True)
    """eps_high (DAPO's clip-higher): ratios above 1 + clip_high stop pushing when the advantage is positive."""
    loss_unit: Literal["token", "sequence"] = "token"
    """token: every completion token weighs the same (DAPO); sequence: the mean over each
    completion, then over completions (GRPO)."""
    scale_rewards: bool = False
    """Divide each group's advantages by the group's reward std (+1e-4), as GRPO does; off: reward -
    group mean (Dr. GRPO, nanochat)."""
    dynamic_sampling: Literal["off", "drop", "refill"] = "off"
    """Groups whose rewards are all equal give no gradient: drop them from the batch, or refill by
    sampling further prompts (up to 3 x prompts_per_step tried per batch) (DAPO)."""
    overlong: Literal["off", "penalty", "mask"] = "off"
    """Completions cut at max_new_tokens: penalty adds DAPO's soft length penalty to the reward
    (over the last overlong_cache tokens of the budget, down to -1); mask leaves them out of the loss."""
    overlong_cache: Optional[int] = bounded(None, low=1)
    """Length of the soft penalty's ramp in tokens (default max_new_tokens // 4)."""
    chat_template: str = "auto"
    """`messages` rows: auto (the tokenizer's chat template when it has one, else gptforge's
    default), default, or a Jinja file (as finetune.chat_template)."""

    def check_values(self) -> None:
        """Refuse values no run can have, before the model loads.

        Raises:
            OptionError (a bad command line, exit 2): naming the key and the allowed values.
        """
        from gptforge.errors import OptionError

        bad = out_of_range(self)
        if bad is not None:
            name, v, allowed = bad
            raise OptionError(f"rl.{name}={v!r}: must be {allowed}")
        if self.samples_per_prompt < 2:
            raise OptionError(f"rl.samples_per_prompt={self.samples_per_prompt}: group advantages (reward - group "
                             "mean) need at least 2 samples per prompt; use 2 or more (e.g. 8)")
        if self.overlong_cache is not None and self.overlong_cache > self.max_new_tokens:
            raise OptionError(f"rl.overlong_cache={self.overlong_cache} > rl.max_new_tokens={self.max_new_tokens}: "
                             "the penalty ramp must fit in the completion budget")
        if self.updates_per_batch > self.samples_per_prompt:
            raise OptionError(f"rl.updates_per_batch={self.updates_per_batch}: each mini-batch takes a share of every "
                             f"group's {self.samples_per_prompt} completions; use at most rl.samples_per_prompt")

    @property
    def ramp(self) -> int:
        """The overlong penalty's ramp length in tokens (overlong_cache, default max_new_tokens // 4, >= 1)."""
        return self.overlong_cache or max(1, self.max_new_tokens // 4)
