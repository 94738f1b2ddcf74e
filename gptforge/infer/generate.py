"""Autoregressive sampling with a KV cache: temperature, top-k, top-p (nucleus), greedy."""

from __future__ import annotations

import torch

from gptforge.model.gpt import GPT


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Mask logits outside the top-k and outside the top-p nucleus (Holtzman et al. 2020) to -inf.

    logits: (B, V) -> (B, V). The most likely token always survives.
    """
    if top_k is not None and 0 < top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and 0.0 < top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the mass before it already reaches top_p.
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
                generator: torch.Generator | None) -> torch.Tensor:
    """Next token ids (B, 1) from last-position logits (B, V); temperature 0 is greedy (argmax)."""
    if temperature <= 0:
        return logits.argmax(-1, keepdim=True)
    logits = filter_logits(logits.float() / temperature, top_k, top_p)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator)


@torch.no_grad()
def generate(model: GPT, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
             use_cache: bool = True, eos_id: int | None = None) -> torch.Tensor:
    """Continue each row of `idx` (B, T) by up to `max_new_tokens` tokens: returns (B, T + n).

    With `use_cache`, the prompt is run once (prefill) and each new token attends to cached
    keys/values: O(T) work per token instead of O(T^2). Greedy output (temperature 0) is identical
    with and without the cache. When the context would exceed block_size, the cache path
    re-prefills the last block_size/2 tokens and the no-cache path crops to the last block_size
    tokens, so both keep going past the model's context length.
    Generation stops early when every row has produced `eos_id`.

    Raises:
        ValueError: an empty prompt.
    """
    if idx.size(1) == 0:
        raise ValueError("the prompt is empty: give at least one token")
    was_training = model.training
    model.eval()
    device = idx.device
    gen = None
    if seed is not None:
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
    block = model.config.block_size
    out = idx
    finished = torch.zeros(idx.size(0), dtype=torch.bool, device=device)
    caches = None
    for _ in range(max_new_tokens):
        if use_cache:
            if caches is None or caches[0].pos + 1 > block:
                context = out[:, -(block // 2 if caches is not None else block):]
                caches = model.make_caches(out.size(0))
                logits = model(context, caches=caches, last_only=True)
            else:
                logits = model(out[:, -1:], caches=caches, last_only=True)
        else:
            logits = model(out[:, -block:], last_only=True)
        nxt = sample_next(logits[:, -1, :], temperature, top_k, top_p, gen)
        if eos_id is not None:
            nxt = torch.where(finished[:, None], torch.full_like(nxt, eos_id), nxt)
            finished |= nxt[:, 0] == eos_id
        out = torch.cat([out, nxt], dim=1)
        if eos_id is not None and bool(finished.all()):
            break
    model.train(was_training)
    return out
