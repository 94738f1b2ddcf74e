"""Held-out evaluation of an RL run: one greedy completion per prompt, scored by the run's rewards.

pass@1 is the mean over prompts of the total reward of the greedy completion (for a 0/1 reward
such as `exact`, the share answered correctly, as nanochat and DeepSeekMath report it). Every
evaluation writes its prompts, completions and rewards to a .jsonl (one object per prompt).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from gptforge.atomic import atomic_write_text
from gptforge.eval.prompts import PromptRow
from gptforge.eval.rewards import Reward, score
from gptforge.infer.generate import generate_batch


def evaluate_prompts(model, prompts: Sequence[PromptRow], rewards: Sequence[Reward], max_new_tokens: int,
                     eos_id: int, decode: Callable[[list[int]], str], out: str | Path | None = None,
                     batch_size: int = 16) -> dict[str, float]:
    """Greedy completions of `prompts` (in batches of `batch_size`, left-padded), scored.

    Returns {"pass@1": mean total reward, "reward/NAME": mean of each reward, "completion_length_mean"}.
    With `out`, writes one JSON object per prompt there (atomically): {"where", "prompt", "completion",
    "finish_reason", "rewards": {name: value}, "reward"}.

    Raises:
        RewardError: a reward function failed (naming the row and the function).
    """
    records: list[dict[str, Any]] = []
    with torch.no_grad():
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start:start + batch_size]
            gens = generate_batch(model, [p.ids for p in chunk], max_new_tokens, temperature=0.0, eos_id=eos_id,
                                  decode=decode)
            for p, g in zip(chunk, gens, strict=True):
                scored = score(rewards, p.prompt, g.text or "", p.row, p.where)
                total = scored.pop("reward")
                records.append({"where": p.where, "prompt": p.prompt, "completion": g.text, "length": len(g.tokens),
                                "finish_reason": g.finish_reason, "rewards": scored, "reward": total})
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    n = max(1, len(records))
    metrics = {"pass@1": sum(r["reward"] for r in records) / n,
               "completion_length_mean": sum(r["length"] for r in records) / n}
    for reward in rewards:
        metrics[f"reward/{reward.name}"] = sum(r["rewards"][reward.name] for r in records) / n
    return metrics
