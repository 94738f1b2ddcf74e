"""Preference files scored on a model (`gptforge evaluate RUN --tasks pairs.jsonl [--reference REF]`).

A preference file is a .jsonl of TRL's pair rows (`gptforge.data.preference`: plain,
conversational or implicit prompt). Each pair's chosen and rejected completions get their summed
log-probability under the model (c, r) and, with a reference model, under it (rc, rr). Metrics
(mean over pairs, with the standard error of the mean):
- pref_acc: share of pairs with c > r (the model prefers the chosen answer);
- logp_margin: mean of c - r in nats;
- with a reference: reward_acc, the share with (c - rc) > (r - rr) (DPO's implicit reward,
  Rafailov et al. 2023 section 5, up to the factor beta that does not change the order), and
  reward_margin, the mean of (c - rc) - (r - rr) in nats.
Pairs longer than the model's context are dropped and counted (`dropped/too_long`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from gptforge.errors import InputError
from gptforge.model.gpt import GPT


def is_preference_file(path: str | Path) -> bool:
    """Whether the first non-blank line of `path` is a JSON object with `chosen` and `rejected`."""
    path = Path(path)
    if path.suffix != ".jsonl" or not path.is_file():
        return False
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    return False
                return isinstance(row, dict) and "chosen" in row and "rejected" in row
    return False


@torch.no_grad()
def pair_logps_all(model: torch.nn.Module, ds, device, precision: str, batch_size: int,
                   progress: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) summed completion log-probs, float64 (N,), of every pair of `ds` (a
    `gptforge.data.preference.PairDataset`), `batch_size` pairs per forward pass."""
    from gptforge.progress import progress as show_progress
    from gptforge.runtime.device import autocast_context
    from gptforge.runtime.preference import pair_logps

    chosen, rejected = [], []
    with show_progress("scoring pairs", len(ds), "pairs", enabled=progress) as bar:
        for start in range(0, len(ds), batch_size):
            idx = range(start, min(start + batch_size, len(ds)))
            c, r = pair_logps(model, ds.batch(idx), device, lambda: autocast_context(torch.device(device), precision))
            chosen.append(c.double().cpu())
            rejected.append(r.double().cpu())
            bar.advance(len(idx))
    return torch.cat(chosen), torch.cat(rejected)


def score_preference_file(model: GPT, tokenizer_json: Path, path: str | Path, device, precision: str,
                          batch_size: int, reference: GPT | None = None, limit: int | None = None,
                          progress: bool = False):
    """A `gptforge.eval.runner.TaskResult` (type "preference") of the pairs of `path`.

    tokenizer_json: the model's tokenizer.json (its folder's tokenizer_config.json gives the chat
    template); reference: a model with the same tokenizer for reward_acc / reward_margin.

    Raises:
        InputError: a bad row (file:line and field), no pair within the model's context.
    """
    from gptforge.atomic import file_sha256
    from gptforge.data.chat import ChatTokenizer
    from gptforge.data.preference import pairs_from_jsonl
    from gptforge.eval.metrics import mean_metric, metric
    from gptforge.eval.runner import TaskResult

    t0 = time.perf_counter()
    path = Path(path)
    tok = ChatTokenizer.from_dir(tokenizer_json)
    block = model.config.block_size
    if reference is not None:
        block = min(block, reference.config.block_size)
    ds = pairs_from_jsonl(path, tok, block + 1)  # inputs are the sequence without its last token
    if limit is not None:
        ds.examples = ds.examples[:limit]
    c, r = pair_logps_all(model, ds, device, precision, batch_size, progress)
    metrics = {"pref_acc": mean_metric((c > r).double().tolist()), "logp_margin": mean_metric((c - r).tolist())}
    if reference is not None:
        if reference.config.vocab_size != model.config.vocab_size:
            raise InputError("--reference has another vocabulary than the model; give the run it was tuned from")
        rc, rr = pair_logps_all(reference, ds, device, precision, batch_size, progress)
        margin = (c - rc) - (r - rr)
        metrics["reward_acc"] = mean_metric((margin > 0).double().tolist())
        metrics["reward_margin"] = mean_metric(margin.tolist())
    metrics["dropped/too_long"] = metric(float(ds.stats["dropped_too_long"]), None, ds.stats["rows"])
    predictions = [{"line": ex.where, "chosen_logp": float(a), "rejected_logp": float(b)}
                   for ex, a, b in zip(ds.examples, c, r, strict=True)]
    return TaskResult(name=path.stem, type="preference", format="pairs", path=str(path), sha256=file_sha256(path),
                      n=len(ds), num_fewshot=0, seed=0, truncated=0, metrics=metrics, chance=0.5,
                      predictions=predictions, seconds=time.perf_counter() - t0)
