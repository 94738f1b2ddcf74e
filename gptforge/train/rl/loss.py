"""The policy-gradient loss of GRPO and DAPO, as pure functions of log-probabilities and rewards.

Notation (one rollout batch): N prompts, each with a group of G sampled completions o_1..o_G;
r_i the reward of o_i; T the padded completion length; m_{i,t} = 1 on the tokens of o_i that
count (its completion tokens, EOS included; 0 on padding and on masked overlong completions).

Group advantage (DeepSeekMath, Shao et al. 2024, eq. 3 outcome supervision; nanochat drops the
division):

    A_i = r_i - mean(r_1..r_G)            or, with scale_rewards,   A_i = (r_i - mean) / (std + eps)

std is the unbiased standard deviation of the group's rewards and eps = 1e-4 (as TRL's GRPOTrainer).

Per-token clipped surrogate (PPO, Schulman et al. 2017, with DAPO's decoupled bounds, Yu et al.
2025, eq. 8 "clip-higher"), with the ratio rho_{i,t} = exp(logp_{i,t} - logp_old_{i,t}):

    l_{i,t} = -min(rho_{i,t} A_i, clip(rho_{i,t}, 1 - eps_low, 1 + eps_high) A_i) + beta * KL_{i,t}

and the KL penalty (default off) is the k3 estimator of KL(pi || pi_ref) (Schulman 2020,
DeepSeekMath eq. 4), with d = logp_ref - logp:

    KL_{i,t} = exp(d) - d - 1

Normalisation ("unit"):
- "token" (DAPO eq. 8, token-level): L = sum_{i,t} m_{i,t} l_{i,t} / sum_{i,t} m_{i,t}
- "sequence" (GRPO, DeepSeekMath eq. 3): L = (1/B) sum_i (sum_t m_{i,t} l_{i,t} / sum_t m_{i,t})

The functions return the SUM (numerator) and the COUNT (denominator: masked tokens, or sequences)
separately, so a trainer that splits a rollout batch into micro-batches and ranks can all-reduce
the count before any backward and divide once: the gradient is then that of L over the whole
batch, whatever the split. With fresh rollouts (logp == logp_old) the loss VALUE is -mean(A) = 0
for any code; only the gradient, sum m A grad(logp) / count, carries the signal.

DAPO's other two parts: `overlong_penalty` (soft overlong punishment, eq. 13) adds a length
penalty to the reward; masking overlong completions (overlong filtering) zeroes their m;
`dynamic_sampling_keep` drops groups whose rewards are all equal (their advantages are all 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

ADVANTAGE_EPS = 1e-4
Unit = Literal["token", "sequence"]


def group_advantages(rewards: torch.Tensor, scale_rewards: bool = False, eps: float = ADVANTAGE_EPS) -> torch.Tensor:
    """Group-relative advantages: rewards (N, G) -> (N, G), A = r - mean_group(r), or
    (r - mean) / (std + eps) with scale_rewards (unbiased std; module docstring).

    Raises:
        ValueError: G < 2 (one sample has no group to compare with: every advantage would be 0).
    """
    if rewards.dim() != 2 or rewards.size(1) < 2:
        raise ValueError(f"group advantages need at least 2 samples per prompt; got rewards of shape "
                         f"{tuple(rewards.shape)}; raise --rl.samples_per_prompt")
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if scale_rewards:
        centred = centred / (rewards.std(dim=1, keepdim=True) + eps)
    return centred


def dynamic_sampling_keep(rewards: torch.Tensor) -> torch.Tensor:
    """DAPO's dynamic sampling filter: rewards (N, G) -> keep (N,) bool, False for a group whose G
    rewards are all equal (zero variance: every advantage is 0, so it adds no gradient)."""
    return (rewards != rewards[:, :1]).any(dim=1)


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, cache: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), added to the reward.

    lengths: (B,) completion lengths in tokens; L_max = max_new_tokens, L_cache = cache. Returns (B,):
    0 for |y| <= L_max - L_cache, ((L_max - L_cache) - |y|) / L_cache up to L_max (so -1 at L_max),
    and -1 beyond.

    Raises:
        ValueError: cache not in 1..max_new_tokens.
    """
    if not 0 < cache <= max_new_tokens:
        raise ValueError(f"overlong cache {cache} must be in 1..max_new_tokens ({max_new_tokens})")
    start = max_new_tokens - cache
    penalty = (start - lengths.float()) / cache
    return penalty.clamp(min=-1.0, max=0.0)


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref): exp(d) - d - 1 with d = ref - logp; (B, T) -> (B, T), >= 0."""
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1


def loss_count(mask: torch.Tensor, unit: Unit) -> float:
    """The normaliser of `policy_loss` for a batch, known before the forward: the counted tokens
    (unit "token"), or the sequences with at least one counted token (unit "sequence"). mask (B, T)."""
    if unit == "token":
        return float(mask.sum().item())
    return float(mask.any(dim=1).sum().item())


@dataclass
class PolicyLoss:
    """`policy_loss`'s result: `loss_sum` (scalar, differentiable) divided by `count` (tokens or
    sequences of the whole batch) is the loss; `metrics` are sums over the same count's units
    (divide by `count` too): clip_low, clip_high (tokens clipped at the low bound with A < 0, at the
    high bound with A > 0), kl (when on), ratio."""

    loss_sum: torch.Tensor
    count: float
    metrics: dict[str, float] = field(default_factory=dict)


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.28, unit: Unit = "token",
                kl_beta: float = 0.0, ref_logprobs: torch.Tensor | None = None) -> PolicyLoss:
    """The clipped policy-gradient loss (module docstring) of B completions, summed.

    logprobs: (B, T) log pi_theta of each completion token (requires grad); old_logprobs (B, T):
    log pi_old, the sampling policy (no grad); advantages (B,); mask (B, T) 1 where a token counts;
    ref_logprobs (B, T) when kl_beta > 0. clip_low, clip_high: eps_low, eps_high.
    unit: "token" (DAPO) sums over tokens, count = sum(mask); "sequence" (GRPO) sums per-sequence
    means, count = the sequences with at least one counted token (`loss_count`).

    Raises:
        ValueError: shapes that disagree, an unknown unit, kl_beta > 0 without ref_logprobs.
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape or advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"policy_loss: logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)}, "
                         f"mask {tuple(mask.shape)} must be (B, T) and advantages {tuple(advantages.shape)} (B,)")
    if unit not in ("token", "sequence"):
        raise ValueError(f"policy_loss: unit must be 'token' or 'sequence', got {unit!r}")
    mask = mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype)[:, None]
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high)
    per_token = -torch.min(ratio * adv, clipped * adv)
    kl = None
    if kl_beta:
        if ref_logprobs is None:
            raise ValueError("policy_loss: kl_beta > 0 needs ref_logprobs (the reference policy's log-probs)")
        kl = k3_kl(logprobs, ref_logprobs)
        per_token = per_token + kl_beta * kl
    with torch.no_grad():
        low = ((ratio < 1 - clip_low) & (adv < 0)).to(mask.dtype)
        high = ((ratio > 1 + clip_high) & (adv > 0)).to(mask.dtype)
        token_stats = {"clip_low": low, "clip_high": high, "ratio": ratio.detach()}
        if kl is not None:
            token_stats["kl"] = kl.detach()
    if unit == "token":
        loss_sum = (per_token * mask).sum()
        count = loss_count(mask, unit)
        metrics = {k: float((v * mask).sum().item()) for k, v in token_stats.items()}
    else:
        lengths = mask.sum(dim=1).clamp(min=1.0)
        loss_sum = ((per_token * mask).sum(dim=1) / lengths).sum()
        count = loss_count(mask, unit)
        metrics = {k: float(((v * mask).sum(dim=1) / lengths).sum().item()) for k, v in token_stats.items()}
    return PolicyLoss(loss_sum, count, metrics)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> tuple[torch.Tensor,
                                                                                                    torch.Tensor]:
    """Log-probabilities of `targets` and the entropy of each position's distribution, both at
    the sampling temperature (logits / temperature, as the sampler drew them).

    logits: (B, T, V); targets: (B, T) int64. Returns (logprobs (B, T) float32, entropy (B, T)
    float32, the latter without gradient).
    """
    scaled = logits.float() / temperature
    logp_all = torch.log_softmax(scaled, dim=-1)
    logprobs = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logprobs, entropy
