"""Rollouts: G completions of one prompt sampled from the current weights, scored by rewards.

Each prompt's group is sampled as ONE batch of G copies of the prompt through gptforge's batched
KV-cache generation (`gptforge.infer.generate.generate_batch`), with a generator seeded from
(seed, step, prompt index) (`rollout_seed`). The batch shape depends on the group alone, never on
how many prompts a rank holds or how groups are split across ranks, so one process and several
ranks sample the same tokens, and a resumed run samples what the uninterrupted one did.

The sampling policy's log-probabilities of the sampled tokens (`old_logprobs`, pi_old of the loss)
come from one forward pass of the same weights over prompt + completions, at the sampling
temperature (logits / temperature), as TRL's GRPOTrainer computes them: the clip ratio of the
first update on a fresh batch is then 1 up to float rounding.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from gptforge.eval.prompts import PromptRow
from gptforge.eval.rewards import Reward, score
from gptforge.infer.generate import generate_batch
from gptforge.model.gpt import GPT
from gptforge.train.rl.loss import token_logprobs


def rollout_seed(seed: int, step: int, prompt_index: int) -> int:
    """The sampling seed of one group: the first 63 bits of SHA-256 of "seed:step:prompt_index"
    (independent streams for neighbouring steps and prompts; the same on every rank and run)."""
    digest = hashlib.sha256(f"{seed}:{step}:{prompt_index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


@dataclass
class Group:
    """The G sampled completions of one prompt, as tensors for the loss.

    input_ids: (G, P + T) int64, the prompt (P tokens) then each completion right-padded to the
    group's longest, T; completion_mask (G, T) bool: the completion's tokens (EOS included);
    old_logprobs (G, T) float32: log pi_old of each completion token (0 on padding); truncated
    (G,) bool: cut at max_new_tokens (no EOS); completions: the G decoded texts (EOS removed);
    rewards (G,) float32 and reward_parts {reward name: (G,)}, set by `score_group`; ref_logprobs
    (G, T) float32: log pi_ref of each completion token when a KL penalty is on (0 on padding).
    """

    prompt_index: int
    prompt: PromptRow
    input_ids: torch.Tensor
    prompt_len: int
    completion_mask: torch.Tensor
    old_logprobs: torch.Tensor
    truncated: torch.Tensor
    completions: list[str]
    rewards: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    reward_parts: dict[str, torch.Tensor] = field(default_factory=dict)
    ref_logprobs: torch.Tensor | None = None

    @property
    def lengths(self) -> torch.Tensor:
        """(G,) completion lengths in tokens."""
        return self.completion_mask.sum(dim=1)


@torch.no_grad()
def completion_logprobs(model: GPT, input_ids: torch.Tensor, prompt_len: int, temperature: float) -> torch.Tensor:
    """log pi(completion token | prefix) of every completion position, at `temperature`.

    input_ids: (G, P + T) -> (G, T) float32 (padding positions hold the log-prob of the pad id;
    mask them). The model runs in eval mode (no dropout) and is put back in its previous mode.
    """
    was_training = model.training
    model.eval()
    try:
        logits = model(input_ids[:, :-1])[:, prompt_len - 1:]
    finally:
        model.train(was_training)
    return token_logprobs(logits, input_ids[:, prompt_len:], temperature)[0]


def sample_group(model: GPT, prompt: PromptRow, prompt_index: int, step: int, *, samples: int,
                 max_new_tokens: int, temperature: float, seed: int, eos_id: int,
                 decode: Callable[[list[int]], str], top_k: int | None = None, top_p: float | None = None,
                 pad_id: int | None = None,
                 reference: Callable[[torch.Tensor, int], torch.Tensor] | None = None) -> Group:
    """Sample `samples` completions of `prompt` as one batch (module docstring) and their old log-probs.

    eos_id ends a completion (it is kept, and trained, as in SFT); pad_id (default eos_id) fills
    the shorter completions. reference(input_ids (G, P+T), P) -> (G, T) gives the reference
    policy's log-probs (`ref_logprobs`, for the KL penalty). The group is not yet scored (`score_group`).

    Raises:
        ValueError: the prompt plus max_new_tokens does not fit in the model's block_size (naming
            the prompt's row).
    """
    P = len(prompt.ids)
    if P + max_new_tokens > model.config.block_size:
        raise ValueError(f"{prompt.where}: the prompt's {P} tokens + max_new_tokens {max_new_tokens} exceed the "
                         f"model's block_size {model.config.block_size}")
    device = model.norm_f.weight.device
    gens = generate_batch(model, [prompt.ids] * samples, max_new_tokens, temperature=temperature, top_k=top_k,
                          top_p=top_p, seed=rollout_seed(seed, step, prompt_index), eos_id=eos_id, decode=decode)
    T = max(1, max(len(g.tokens) for g in gens))
    pad = eos_id if pad_id is None else pad_id
    rows = [prompt.ids + g.tokens + [pad] * (T - len(g.tokens)) for g in gens]
    input_ids = torch.tensor(rows, dtype=torch.long, device=device)
    mask = torch.tensor([[t < len(g.tokens) for t in range(T)] for g in gens], dtype=torch.bool, device=device)
    old = completion_logprobs(model, input_ids, P, temperature) * mask
    truncated = torch.tensor([g.finish_reason == "length" for g in gens], dtype=torch.bool, device=device)
    group = Group(prompt_index, prompt, input_ids, P, mask, old, truncated, [g.text or "" for g in gens])
    if reference is not None:
        group.ref_logprobs = reference(input_ids, P) * mask
    return group


def score_group(group: Group, rewards: Sequence[Reward]) -> Group:
    """Set `group.rewards` (G,) (the weighted sum) and `group.reward_parts` from `rewards`.

    Raises:
        RewardError: a reward function raised or returned a non-number (naming the row and function).
    """
    scored = [score(rewards, group.prompt.prompt, text, group.prompt.row, f"{group.prompt.where} (sample {i})")
              for i, text in enumerate(group.completions)]
    group.rewards = torch.tensor([s["reward"] for s in scored], dtype=torch.float32)
    group.reward_parts = {r.name: torch.tensor([s[r.name] for s in scored], dtype=torch.float32) for r in rewards}
    return group
