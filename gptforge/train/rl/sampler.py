"""The RL sampler: which prompts each rollout batch holds, sampling them on this rank, and the
mini-batch of each optimizer step.

Rollout batch k serves optimizer steps k*U .. k*U + U - 1 (U = rl.updates_per_batch), step k*U + u
on mini-batch u: completions G*u//U .. G*(u+1)//U - 1 of every group (`mini_batches`); its prompts
are positions k*N .. k*N + N - 1 (N = rl.prompts_per_step) of one prompt stream: epoch e is a
permutation of the prompt file keyed on (train.seed, e), so every prompt is used once per epoch.
The group at stream position q goes to data-parallel rank q % dp and is sampled with the seed
(train.seed, k, q) (`rollout_seed`): every layout samples the same completions.

Dynamic sampling: "drop" leaves the groups whose rewards are all equal out of the loss (their rows
stay in the batch with an empty loss mask, so every rank runs the same number of micro-batches);
"refill" then samples further rounds of N prompts (stream positions past the batch's own, counted
in the batch's own range of the stream: the range of batch k is k*4N .. k*4N + 4N - 1 with refill)
until at least N groups have reward variance, at most 3 rounds in all.

State in the checkpoint (`state_dict`): the rollout batch being served (its rows and metrics),
so a resume in the middle of a rollout batch continues on the same rows; everything else is a
function of (seed, step).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from gptforge.config.rl import RLConfig
from gptforge.eval.prompts import PromptRow
from gptforge.eval.rewards import Reward
from gptforge.train.rl.batch import kept_groups, rollout_rows, shape_rewards
from gptforge.train.rl.loss import dynamic_sampling_keep
from gptforge.train.rl.rollout import Group, sample_group, score_group

REFILL_ROUNDS = 3


def mini_batches(rows: dict[str, torch.Tensor], n_groups: int, G: int, U: int) -> list[dict[str, torch.Tensor]]:
    """`rows` of n_groups groups of G completions (in group order) cut into U mini-batches: mini-batch
    u takes completions G*u//U .. G*(u+1)//U - 1 of every group, so it holds the same completions
    however the groups are dealt to ranks."""
    minis = []
    for u in range(U):
        idx = torch.tensor([g * G + j for g in range(n_groups) for j in range(G * u // U, G * (u + 1) // U)],
                           dtype=torch.long, device=rows["advantages"].device)
        minis.append({k: v[idx] for k, v in rows.items()})
    return minis


class RolloutSampler:
    """Samples, scores and serves rollout batches (module docstring) for one data-parallel rank.

    all_reduce_sum(list of floats) -> list of floats sums over the data-parallel ranks, and
    gather(list of floats) -> one such list per rank (identities in one process); reference(input_ids, P) -> (G, T) gives the KL reference's log-probs (or None).

    Raises:
        InputError (at construction): prompts_per_step not divisible by the data-parallel size.
    """

    def __init__(self, prompts: Sequence[PromptRow], rewards: Sequence[Reward], cfg: RLConfig, seed: int,
                 eos_id: int, decode: Callable[[list[int]], str], dp_rank: int = 0, dp_size: int = 1,
                 all_reduce_sum: Callable[[list[float]], list[float]] | None = None,
                 gather: Callable[[list[float]], list[list[float]]] | None = None,
                 reference: Callable[[torch.Tensor, int], torch.Tensor] | None = None):
        from gptforge.errors import InputError

        if cfg.prompts_per_step % dp_size:
            raise InputError(f"rl.prompts_per_step={cfg.prompts_per_step} must be a multiple of the "
                             f"{dp_size} data-parallel ranks (each rank samples whole groups)")
        self.prompts, self.rewards, self.cfg, self.seed = list(prompts), list(rewards), cfg, seed
        self.eos_id, self.decode, self.dp_rank, self.dp_size = eos_id, decode, dp_rank, dp_size
        self.all_reduce_sum = all_reduce_sum or (lambda xs: xs)
        self.gather = gather or (lambda xs: [xs])
        self.reference = reference
        self.batch_index: int | None = None
        self.minis: list[dict[str, torch.Tensor]] = []
        self.metrics: dict[str, float] = {}

    def prompt_at(self, position: int) -> int:
        """Index in the prompt file of stream position `position` (module docstring)."""
        n = len(self.prompts)
        epoch, offset = divmod(position, n)
        order = np.random.Generator(np.random.Philox(key=[self.seed & (2**64 - 1), epoch])).permutation(n)
        return int(order[offset])

    def _round(self, model, k: int, first: int) -> list[Group]:
        """This rank's groups of stream positions first .. first + N - 1, sampled and scored."""
        c = self.cfg
        groups = []
        for q in range(first + self.dp_rank, first + c.prompts_per_step, self.dp_size):
            p = self.prompts[self.prompt_at(q)]
            g = sample_group(model, p, q, k, samples=c.samples_per_prompt, max_new_tokens=c.max_new_tokens,
                             temperature=c.temperature, seed=self.seed, eos_id=self.eos_id, decode=self.decode,
                             top_p=c.top_p if c.top_p < 1 else None, reference=self.reference)
            groups.append(score_group(g, self.rewards))
        shape_rewards(groups, c.overlong, c.max_new_tokens, c.ramp)
        return groups

    def sample(self, model, k: int) -> None:
        """Sample rollout batch `k` on this rank and cut it into rl.updates_per_batch mini-batches."""
        c = self.cfg
        t0 = time.perf_counter()
        span = c.prompts_per_step * (REFILL_ROUNDS + 1 if c.dynamic_sampling == "refill" else 1)
        groups = self._round(model, k, k * span)
        rounds = 1
        while c.dynamic_sampling == "refill" and rounds < REFILL_ROUNDS:
            (n_kept,) = self.all_reduce_sum([float(len(kept_groups(groups, "drop")))])
            if n_kept >= c.prompts_per_step:
                break
            groups += self._round(model, k, k * span + rounds * c.prompts_per_step)
            rounds += 1
        kept = kept_groups(groups, c.dynamic_sampling)
        if c.dynamic_sampling != "off":
            for g in groups:
                if not any(g is x for x in kept):
                    g.completion_mask = torch.zeros_like(g.completion_mask)
        rows = rollout_rows(groups, c.scale_rewards, mask_overlong=c.overlong == "mask")
        self.minis = mini_batches(rows, len(groups), c.samples_per_prompt, c.updates_per_batch)
        self.metrics = self._global_metrics(groups, kept, time.perf_counter() - t0)
        self.batch_index = k

    def _global_metrics(self, groups: list[Group], kept: list[Group], seconds: float) -> dict[str, float]:
        """The rollout metrics (reward mean/std and per reward, zero-variance and kept shares, completion
        length mean/max and cut share, sampled tokens) of every rank's groups together: sums
        gathered from the ranks (`gather`), then the means, the unbiased reward std and the
        maximum length formed from them, so they equal one process's figures."""
        rewards = torch.cat([g.rewards for g in groups]).double()
        lengths = torch.cat([g.lengths.cpu() for g in groups]).double()
        zero_var = float((~dynamic_sampling_keep(torch.stack([g.rewards for g in groups]))).sum())
        parts = sorted(groups[0].reward_parts)
        local = [float(rewards.numel()), float(rewards.sum()), float((rewards ** 2).sum()), zero_var, float(len(kept)),
                 float(len(groups)), float(lengths.sum()), float(lengths.max()),
                 float(torch.cat([g.truncated.cpu() for g in groups]).sum())]
        local += [float(torch.cat([g.reward_parts[p] for g in groups]).double().sum()) for p in parts]
        rows = self.gather(local)
        tot = [sum(r[i] for r in rows) for i in range(len(local))]
        n, s1, s2 = tot[0], tot[1], tot[2]
        var = max(0.0, (s2 - s1 * s1 / n) / (n - 1)) if n > 1 else 0.0
        out = {"reward_mean": s1 / n, "reward_std": var ** 0.5, "zero_variance_share": tot[3] / tot[5],
               "groups_kept_share": tot[4] / tot[5], "completion_length_mean": tot[6] / n,
               "completion_length_max": max(r[7] for r in rows), "completion_cut_share": tot[8] / n,
               "sampled_tokens": tot[6], "rounds": tot[5] / self.cfg.prompts_per_step, "sampling_seconds": seconds}
        out.update({f"reward/{p}": tot[9 + i] / n for i, p in enumerate(parts)})
        return out

    def mini_batch(self, model, step: int) -> dict[str, torch.Tensor]:
        """The rows of optimizer step `step` on this rank (sampling rollout batch step // U first
        when it is not the one held)."""
        k, u = divmod(step, self.cfg.updates_per_batch)
        if self.batch_index != k:
            self.sample(model, k)
        return self.minis[u]

    def state_dict(self) -> dict:
        """The held rollout batch (index, mini-batches, metrics): what a resume in its middle needs."""
        return {"batch_index": self.batch_index, "minis": self.minis, "metrics": dict(self.metrics)}

    def load_state_dict(self, state: dict) -> None:
        self.batch_index = state.get("batch_index")
        self.minis = list(state.get("minis") or [])
        self.metrics = dict(state.get("metrics") or {})
