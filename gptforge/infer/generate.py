"""Autoregressive sampling with a KV cache: temperature, top-k, top-p (nucleus), greedy; batched
prompts of different lengths (left-padded); stop strings; one sliding rule past the context.

The context rule, the same with and without the KV cache (`slide_window`): a prompt longer than
the model's block_size keeps its last block_size tokens (with a warning giving both counts); when
a row's context would then grow past block_size, it keeps its last block_size // 2 tokens, and the
cache path re-prefills them. The no-cache path recomputes exactly the same window every token, so
the two paths give the same logits (up to float rounding) however long the generation runs.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from gptforge.infer.static_decode import StaticDecoder, bucket_length, static_decoder
from gptforge.model.gpt import GPT

# Temperatures below this sample greedily, as vLLM's SamplingParams does (_SAMPLING_EPS): dividing
# the logits by a subnormal temperature overflows them to inf, and softmax then gives NaN.
MIN_TEMPERATURE = 1e-5
# Smaller top_p values are raised to this: in float32 a top_p under ~1e-45 is 0, which drops every token
# (softmax of all -inf is NaN). Any top_p below the best token's probability (>= 1/vocab_size > 1e-7)
# keeps that token alone, so the answer is the same.
MIN_TOP_P = 1e-7


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Mask logits outside the top-k and outside the top-p nucleus (Holtzman et al. 2020) to -inf.

    logits: (B, V) -> (B, V). The most likely token always survives.
    """
    if top_k is not None and 0 < top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and 0.0 < top_p < 1.0:
        top_p = max(top_p, MIN_TOP_P)
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the mass before it already reaches top_p.
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
                generator: torch.Generator | None) -> torch.Tensor:
    """Next token ids (B, 1) from last-position logits (B, V); temperature 0 (or below
    MIN_TEMPERATURE) is greedy (argmax)."""
    if temperature < MIN_TEMPERATURE:
        return logits.argmax(-1, keepdim=True)
    logits = filter_logits(logits.float() / temperature, top_k, top_p)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator)


def slide_window(start: int, length: int, block_size: int) -> int:
    """The one context rule of generation: the start index of a row's context window.

    A row holds `length` tokens (prompt + generated so far) and its window began at `start`.
    Returns `start` while the window `length - start` fits in `block_size`; otherwise the window
    moves to the last `max(1, block_size // 2)` tokens (halving amortises the cache re-prefill:
    one prefill per block_size // 2 new tokens). A prompt cut before generation starts keeps its
    last block_size tokens instead (`cut_prompt`).
    """
    if length - start <= block_size:
        return start
    return length - max(1, block_size // 2)


def cut_prompt(n_tokens: int, block_size: int, where: str = "prompt") -> int:
    """Start index of a prompt of `n_tokens` in a context of `block_size`: 0, or with a warning
    naming both counts, n_tokens - block_size (the prompt keeps its last block_size tokens)."""
    if n_tokens <= block_size:
        return 0
    warnings.warn(f"{where} of {n_tokens} tokens is longer than the model's context of {block_size} tokens: "
                  f"the first {n_tokens - block_size} tokens are dropped", stacklevel=3)
    return n_tokens - block_size


def padded_batch(rows: Sequence[Sequence[int]], device) -> tuple[torch.Tensor, torch.Tensor | None,
                                                                  torch.Tensor | None, list[int]]:
    """Left-pad `rows` (B lists of ids) to one batch.

    Returns (idx (B, W) int64, position_ids (B, W) or None, attn_mask (B, 1, W, W) bool or None,
    pads: list of B pad counts). Row b's real tokens take positions 0..len_b-1 (position ids start
    after its padding); a real query attends causally to real keys only. A padding query attends
    to itself alone, so no attention row is fully masked (finite outputs on every attention path).
    position_ids and attn_mask are None when no row is padded (plain causal attention).
    """
    W = max(len(r) for r in rows)
    pads = [W - len(r) for r in rows]
    idx = torch.tensor([[0] * p + list(r) for p, r in zip(pads, rows, strict=True)], dtype=torch.long, device=device)
    if not any(pads):
        return idx, None, None, pads
    pad = torch.tensor(pads, device=device)[:, None]  # (B, 1)
    ar = torch.arange(W, device=device)[None, :]  # (1, W)
    position_ids = (ar - pad).clamp(min=0)
    real_key = ar >= pad  # (B, W)
    causal = torch.ones(W, W, dtype=torch.bool, device=device).tril()
    eye = torch.eye(W, dtype=torch.bool, device=device)
    mask = (causal[None] & real_key[:, None, :]) | eye[None]
    return idx, position_ids, mask[:, None], pads


@dataclass
class Generation:
    """One row's result of `generate_batch`.

    tokens: the generated ids (prompt excluded); with a stop string, up to the token that completed
    it; with eos_id, up to and including the EOS token. finish_reason: "stop" (EOS or a stop
    string) or "length" (max_new_tokens reached). text: the decoded continuation, cut before the
    stop string (only when `decode` was given, else None).
    """

    tokens: list[int] = field(default_factory=list)
    finish_reason: str = "length"
    text: str | None = None


def find_stop(text: str, stop: Sequence[str]) -> int | None:
    """Index in `text` of the earliest occurrence of any of the `stop` strings, or None."""
    hits = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return min(hits) if hits else None


@torch.no_grad()
def generate_batch(model: GPT, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float = 1.0,
                   top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                   use_cache: bool = True, eos_id: int | None = None, stop: Sequence[str] = (),
                   decode: Callable[[list[int]], str] | None = None, compile: bool = False) -> list[Generation]:
    """Continue each prompt (lists of ids, any lengths) by up to `max_new_tokens` tokens, as one batch.

    Prompts of different lengths are left-padded (`padded_batch`): each row's position ids start
    at 0 after its padding and no real token attends to padding, so a row's greedy continuation
    equals the same prompt run alone (up to float rounding of batched matrix products). With
    `use_cache` the prompts are prefilled once and each step feeds one token per row; without it
    every step recomputes the whole window. Past the context, both follow `slide_window`.
    A row stops at `eos_id` or when its decoded continuation contains one of the `stop` strings
    (needs `decode`, ids -> text); the batch stops when every row has stopped. `compile` (with
    the cache) decodes through a `StaticDecoder` (gptforge.infer.static_decode): eager prefill,
    then a compiled one-token step over a static cache of a power-of-two length (same tokens up to
    float rounding; the first call per model, batch size and length bucket compiles).

    Returns: one Generation per prompt, in order.

    Raises:
        ValueError: an empty prompt (naming its index), stop strings without `decode`, `compile`
            without `use_cache`.
    """
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty: give at least one token")
    if stop and decode is None:
        raise ValueError("stop strings need `decode` (token ids -> text)")
    if compile and not use_cache:
        raise ValueError("compile needs the KV cache (it compiles the cached decode step): drop use_cache=False "
                         "or compile=True")
    was_training = model.training
    model.eval()
    device = model.norm_f.weight.device  # not wte: a quantized embedding stores int8
    gen = None
    if seed is not None:
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
    block = model.config.block_size
    tokens = [list(p) for p in prompts]
    starts = [cut_prompt(len(p), block, f"prompt {i}" if len(prompts) > 1 else "the prompt")
              for i, p in enumerate(prompts)]
    dec = None
    if compile:
        width = max(len(t) - s for s, t in zip(starts, tokens, strict=True))
        dec = static_decoder(model, len(tokens), bucket_length(min(block, width + max_new_tokens - 1), block))
    results = [Generation() for _ in prompts]
    done = [False] * len(prompts)
    caches, pads, nxt = None, None, None
    for _ in range(max_new_tokens):
        new_starts = [slide_window(s, len(t), block) for s, t in zip(starts, tokens, strict=True)]
        if not use_cache or caches is None or new_starts != starts:
            starts = new_starts
            idx, pos, mask, pads = padded_batch([t[s:] for s, t in zip(starts, tokens, strict=True)], device)
            logits, caches = _prefill(model, dec, idx, pos, mask, pads, use_cache)
        elif dec is not None:
            logits = dec.step(nxt)
        else:
            last, pos, mask = _decode_inputs(nxt, starts, tokens, pads, caches[0].pos, device)
            logits = model(last, position_ids=pos, attn_mask=mask, caches=caches, last_only=True)[:, -1]
        nxt = sample_next(logits, temperature, top_k, top_p, gen)
        _take_tokens(nxt[:, 0].tolist(), tokens, results, done, eos_id, stop, decode)
        if all(done):
            break
    model.train(was_training)
    if decode is not None:
        _decode_texts(results, decode, eos_id, stop)
    return results


def _prefill(model: GPT, dec: StaticDecoder | None, idx: torch.Tensor, pos: torch.Tensor | None,
             mask: torch.Tensor | None, pads: list[int], use_cache: bool) -> tuple[torch.Tensor, list | None]:
    """The prefill (or, without the cache, the whole-window pass) of `generate_batch` over the
    left-padded window idx (B, W): (last-position logits (B, V), the caches or None)."""
    if dec is not None:
        return dec.prefill(idx, pos, mask, pads), dec.caches
    caches = model.make_caches(idx.size(0)) if use_cache else None
    return model(idx, position_ids=pos, attn_mask=mask, caches=caches, last_only=True)[:, -1], caches


def _decode_inputs(last: torch.Tensor, starts: list[int], tokens: list[list[int]], pads: list[int],
                   cache_len: int, device) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Inputs of one cached eager decode step of `generate_batch`: (last, position_ids, attn_mask).

    last: each row's newest token, (B, 1) int64, the previous step's sample as it is. When some
    row is left-padded (`pads`, from the prefill's `padded_batch`), position_ids (B, 1) is each
    real token's position within its window (`tokens[b][starts[b]:]`) and attn_mask (B, 1, 1, S)
    bool hides the padding among the S = cache_len + 1 keys (the cache's `cache_len` filled
    positions and this token); both are None otherwise (the cache's own positions and plain
    causal attention suffice).
    """
    if not any(pads):
        return last, None, None
    lengths = [len(t) - s for s, t in zip(starts, tokens, strict=True)]
    pos = torch.tensor([[n - 1] for n in lengths], device=device)
    S = cache_len + 1
    pad = torch.tensor(pads, device=device)[:, None]
    mask = (torch.arange(S, device=device)[None, :] >= pad)[:, None, None, :]  # (B, 1, 1, S)
    return last, pos, mask


def _take_tokens(nxt: list[int], tokens: list[list[int]], results: list[Generation], done: list[bool],
                 eos_id: int | None, stop: Sequence[str], decode: Callable[[list[int]], str] | None) -> None:
    """Append one sampled token per row (`nxt`, B ids) to each row's context in `tokens`, and to
    its Generation while the row runs; a row stops (done[b], finish_reason "stop") at `eos_id` or
    when its decoded continuation contains one of the `stop` strings."""
    for b, t in enumerate(nxt):
        tokens[b].append(t)
        if done[b]:
            continue
        r = results[b]
        r.tokens.append(t)
        if eos_id is not None and t == eos_id:
            done[b], r.finish_reason = True, "stop"
        elif stop:
            assert decode is not None  # generate_batch refuses stop strings without decode
            cut = find_stop(decode(r.tokens), stop)
            if cut is not None:
                done[b], r.finish_reason = True, "stop"


def _decode_texts(results: list[Generation], decode: Callable[[list[int]], str], eos_id: int | None,
                  stop: Sequence[str]) -> None:
    """Set each Generation's text: its tokens decoded without EOS, cut before the first stop string."""
    for r in results:
        text = decode([t for t in r.tokens if t != eos_id] if eos_id is not None else r.tokens)
        cut = find_stop(text, stop) if stop else None
        r.text = text if cut is None else text[:cut]


@torch.no_grad()
def generate(model: GPT, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
             use_cache: bool = True, eos_id: int | None = None, compile: bool = False) -> torch.Tensor:
    """Continue each row of `idx` (B, T) by up to `max_new_tokens` tokens: returns (B, T + n).

    With `use_cache`, the prompt is run once (prefill) and each new token attends to cached
    keys/values: O(T) work per token instead of O(T^2). Greedy output (temperature 0) is identical
    with and without the cache, also past the model's context (`slide_window`: one rule for both
    paths). A prompt longer than block_size keeps its last block_size tokens, with a warning.
    Generation stops early when every row has produced `eos_id`; rows that stopped earlier are
    filled with `eos_id`. For prompts of different lengths and stop strings, see `generate_batch`;
    for `compile`, `StaticDecoder`.

    Raises:
        ValueError: an empty prompt.
    """
    if idx.size(1) == 0:
        raise ValueError("the prompt is empty: give at least one token")
    res = generate_batch(model, idx.tolist(), max_new_tokens, temperature, top_k, top_p, seed, use_cache, eos_id,
                         compile=compile)
    n = max(len(r.tokens) for r in res)
    fill = eos_id if eos_id is not None else 0
    new = torch.tensor([r.tokens + [fill] * (n - len(r.tokens)) for r in res], dtype=torch.long, device=idx.device)
    return torch.cat([idx, new.view(idx.size(0), n)], dim=1)
