"""From scored rollout groups to loss micro-batches: reward shaping, group advantages, dynamic
sampling, and the rows the policy loss reads.

A rollout row is prompt + completion, right-padded to the batch's longest row L, read as the
next-token frame of SFT: position j predicts input_ids[j + 1], so completion token t of a prompt
of P tokens sits at column P - 1 + t of the (B, L - 1) tensors `loss_mask`, `old_logprobs` and
`ref_logprobs`. Right padding leaves every real token's causal context unchanged, so a row's
log-probabilities do not depend on which rows share its micro-batch (up to float rounding of
batched matrix products).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence

import torch

from gptforge.train.rl.loss import dynamic_sampling_keep, group_advantages, overlong_penalty, token_logprobs
from gptforge.train.rl.rollout import Group


def shape_rewards(groups: Sequence[Group], overlong: str, max_new_tokens: int, ramp: int) -> None:
    """With overlong "penalty", add DAPO's soft overlong penalty (`overlong_penalty`) of each
    completion's length to its reward, recorded as reward part "overlong"; otherwise nothing."""
    if overlong != "penalty":
        return
    for g in groups:
        pen = overlong_penalty(g.lengths.cpu(), max_new_tokens, ramp)
        g.reward_parts["overlong"] = pen
        g.rewards = g.rewards + pen


def kept_groups(groups: Sequence[Group], dynamic_sampling: str) -> list[Group]:
    """The groups that enter the loss: all, or with dynamic sampling "drop"/"refill" those whose
    rewards are not all equal (`dynamic_sampling_keep`)."""
    if dynamic_sampling == "off" or not groups:
        return list(groups)
    keep = dynamic_sampling_keep(torch.stack([g.rewards for g in groups]))
    return [g for g, k in zip(groups, keep.tolist(), strict=True) if k]


def rollout_rows(groups: Sequence[Group], scale_rewards: bool, mask_overlong: bool) -> dict[str, torch.Tensor]:
    """The loss's tensors for every completion of `groups` (B = sum of group sizes), in group order.

    Returns {"input_ids": (B, L) int64, "loss_mask": (B, L-1) bool, "old_logprobs": (B, L-1) float32,
    "ref_logprobs": (B, L-1) float32 (zeros when the groups carry none), "advantages": (B,) float32}.
    mask_overlong: truncated completions get an all-False loss_mask (DAPO's overlong filtering).
    """
    adv = [group_advantages(g.rewards[None, :], scale_rewards)[0] for g in groups]
    L = max(g.input_ids.size(1) for g in groups)
    B = sum(g.input_ids.size(0) for g in groups)
    device = groups[0].input_ids.device
    input_ids = torch.zeros(B, L, dtype=torch.long, device=device)
    loss_mask = torch.zeros(B, L - 1, dtype=torch.bool, device=device)
    old = torch.zeros(B, L - 1, dtype=torch.float32, device=device)
    ref = torch.zeros(B, L - 1, dtype=torch.float32, device=device)
    row = 0
    for g in groups:
        G, W = g.input_ids.shape
        P, T = g.prompt_len, W - g.prompt_len
        input_ids[row:row + G, :W] = g.input_ids
        input_ids[row:row + G, W:] = g.input_ids[:, -1:]  # pad with the row's last id (masked anyway)
        mask = g.completion_mask & ~g.truncated[:, None] if mask_overlong else g.completion_mask
        loss_mask[row:row + G, P - 1:P - 1 + T] = mask
        old[row:row + G, P - 1:P - 1 + T] = g.old_logprobs
        if g.ref_logprobs is not None:
            ref[row:row + G, P - 1:P - 1 + T] = g.ref_logprobs
        row += G
    advantages = torch.cat(adv).to(device=device, dtype=torch.float32)
    return {"input_ids": input_ids, "loss_mask": loss_mask, "old_logprobs": old, "ref_logprobs": ref,
            "advantages": advantages}


def split_rows(rows: dict[str, torch.Tensor], parts: int) -> list[dict[str, torch.Tensor]]:
    """`rows` cut into `parts` consecutive slices of (nearly) equal row counts (mini-batches or
    micro-batches); each slice keeps the batch's width L."""
    B = rows["advantages"].size(0)
    bounds = [B * i // parts for i in range(parts + 1)]
    return [{k: v[a:b] for k, v in rows.items()} for a, b in itertools.pairwise(bounds) if b > a]


def rows_logprobs(model, rows: dict[str, torch.Tensor], temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The current policy's log-probabilities and entropies at every next-token position of
    `rows`: ((B, L-1) float32 with gradient, (B, L-1) float32 without), at `temperature`."""
    ids = rows["input_ids"]
    return token_logprobs(model(ids[:, :-1]), ids[:, 1:], temperature)


@contextlib.contextmanager
def adapters_off(model) -> Iterator[None]:
    """Inside: every LoRA layer of `model` computes its base layer alone (scaling 0), so the
    model is the reference policy of a LoRA run; the scalings are restored on exit."""
    from gptforge.model.lora import LoRALinear

    layers = [m for m in model.modules() if isinstance(m, LoRALinear)]
    saved = [m.scaling for m in layers]
    for m in layers:
        m.scaling = 0.0
    try:
        yield
    finally:
        for m, s in zip(layers, saved, strict=True):
            m.scaling = s

