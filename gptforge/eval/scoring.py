"""Log-likelihood of continuations given contexts, with each shared context run once.

Encoding follows lm-evaluation-harness 0.4 (`TemplateLM._encode_pair`) so that token boundaries,
and therefore scores, are the same: trailing whitespace of the context moves to the start of the
continuation; the context is encoded alone and context + continuation jointly, and the
continuation's tokens are the joint encoding after the context's token count. An empty context
is the end-of-text token.

Scoring packs one context with all its continuations into one sequence (`pack`): the context's
L tokens, then each continuation but its last token, with position ids restarting at L for each
continuation and an attention mask that lets a continuation see the context and itself only.
The context's keys and values are computed once instead of once per choice, the same trick as
reusing its KV cache, in one forward pass. The log-probability of a continuation's first token
comes from the context's last position. A request whose context and continuation do not fit in
block_size + 1 tokens is scored alone with its context truncated from the left, as lm-eval's
`hf` backend does (`(context + continuation)[-(max_length + 1):]`); the scorer counts those.
Units are sorted by length and batched; padding (left or right) is masked out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from gptforge.errors import InputError
from gptforge.runtime.device import autocast_context

if TYPE_CHECKING:
    from gptforge.model.gpt import GPT


def encode_pair(encode: Callable[[str], list[int]], context: str, continuation: str,
                prefix_id: int) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-eval 0.4 encodes a request (see the module doc)."""
    if context == "":
        cont = encode(continuation)
        return ([prefix_id], cont) if not cont or cont[0] != prefix_id else (cont[:1], cont[1:])
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    ctx = encode(context)
    whole = encode(context + continuation)
    return ctx, whole[len(ctx):]


@dataclass
class Unit:
    """One packed sequence: a context and the continuations scored against it.

    requests: indices into the request list, one per continuation in `conts`.
    """

    ctx: list[int]
    conts: list[list[int]]
    requests: list[int]

    @property
    def length(self) -> int:
        return len(self.ctx) + sum(len(c) - 1 for c in self.conts)


def make_units(pairs: list[tuple[list[int], list[int]]], block_size: int) -> tuple[list[Unit], int]:
    """Group encoded (context, continuation) pairs by context into `Unit`s.

    Returns: (units, number of requests whose context was truncated from the left).

    Raises:
        InputError: an empty continuation, or one longer than block_size tokens (nothing of the
            context would remain).
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (ctx, cont) in enumerate(pairs):
        if not cont:
            raise InputError(f"request {i}: the continuation encodes to no tokens")
        if len(cont) > block_size:
            raise InputError(f"a continuation of {len(cont)} tokens does not fit the model's context of "
                             f"{block_size} tokens")
        groups.setdefault(tuple(ctx), []).append(i)
    units, truncated = [], 0
    limit = 2 * block_size  # keep one packed sequence's attention cost bounded
    for ctx_key, idx in groups.items():
        ctx = list(ctx_key)
        fits = [i for i in idx if len(ctx) + len(pairs[i][1]) <= block_size + 1]
        for i in idx:
            if len(ctx) + len(pairs[i][1]) > block_size + 1:
                keep = block_size + 1 - len(pairs[i][1])
                units.append(Unit(ctx[len(ctx) - keep:], [pairs[i][1]], [i]))
                truncated += 1
        cur: list[int] = []
        for i in fits:
            if cur and len(ctx) + sum(len(pairs[j][1]) - 1 for j in cur + [i]) > limit:
                units.append(Unit(ctx, [pairs[j][1] for j in cur], cur))
                cur = []
            cur.append(i)
        if cur:
            units.append(Unit(ctx, [pairs[j][1] for j in cur], cur))
    return units, truncated


def pack(units: list[Unit], padding_side: str = "right"):
    """Batch tensors for `units`.

    Returns: (idx (B, T) int64, position_ids (B, T), attn_mask (B, 1, T, T) bool, targets) where
    targets is a list of (row, position predicting the token, token id, request index).
    Query q may attend to key k when k <= q and k is in the context or in q's own continuation;
    padding positions attend only to themselves, so no softmax row is empty.
    """
    T = max(u.length for u in units)
    ids: list[list[int]] = []
    pos: list[list[int]] = []
    seg: list[list[int]] = []
    targets: list[tuple[int, int, int, int]] = []
    for r, u in enumerate(units):
        L, pad = len(u.ctx), T - u.length
        off = pad if padding_side == "left" else 0
        row_ids, row_pos, row_seg = list(u.ctx), list(range(L)), [0] * L
        start = off + L
        for j, (cont, req) in enumerate(zip(u.conts, u.requests, strict=True), start=1):
            n = len(cont) - 1
            row_ids += cont[:-1]
            row_pos += range(L, L + n)
            row_seg += [j] * n
            preds = [off + L - 1] + list(range(start, start + n))
            targets.extend((r, p, t, req) for p, t in zip(preds, cont, strict=True))
            start += n
        fill = ([0] * pad, [0] * pad, [-1] * pad)
        if padding_side == "left":
            row_ids, row_pos, row_seg = fill[0] + row_ids, fill[1] + row_pos, fill[2] + row_seg
        else:
            row_ids, row_pos, row_seg = row_ids + fill[0], row_pos + fill[1], row_seg + fill[2]
        ids.append(row_ids)
        pos.append(row_pos)
        seg.append(row_seg)
    idx = torch.tensor(ids, dtype=torch.long)
    segs = torch.tensor(seg, dtype=torch.long)
    sq, sk = segs[:, :, None], segs[:, None, :]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    mask = causal & (sq >= 0) & ((sk == 0) | (sk == sq))
    mask |= torch.eye(T, dtype=torch.bool)  # padding rows see themselves; real rows already do
    return idx, torch.tensor(pos, dtype=torch.long), mask[:, None], targets


@torch.no_grad()
def score_units(model: GPT, units: list[Unit], n_requests: int, batch_size: int = 32,
                device: torch.device | str = "cpu", precision: str = "fp32", padding_side: str = "right",
                on_batch: Callable[[int], None] | None = None) -> tuple[list[float], list[bool]]:
    """Sum of log-probabilities (nats) and greedy flag of every request's continuation.

    `batch_size` units go through the model per forward pass, longest first. Log-softmax is taken
    in fp32 whatever the autocast precision. The model is put in eval mode and restored after.

    Returns: (loglikelihood per request, True where every continuation token is the argmax).
    """
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    device = torch.device(device)
    ll = torch.zeros(n_requests, dtype=torch.float64)
    miss = torch.zeros(n_requests, dtype=torch.long)
    order = sorted(range(len(units)), key=lambda i: -units[i].length)
    was_training = model.training
    model.eval()
    try:
        for b in range(0, len(order), batch_size):
            chunk = [units[i] for i in order[b:b + batch_size]]
            idx, pos, mask, targets = pack(chunk, padding_side)
            rows = torch.tensor([t[0] for t in targets], device=device)
            cols = torch.tensor([t[1] for t in targets], device=device)
            toks = torch.tensor([t[2] for t in targets], device=device)
            reqs = torch.tensor([t[3] for t in targets])
            with autocast_context(device, precision):
                # Logits only where a continuation token is predicted: the vocabulary projection
                # is a large share of a small model's work.
                logits = model(idx.to(device), position_ids=pos.to(device), attn_mask=mask.to(device),
                               select=(rows, cols))
            logp = logits.float().log_softmax(-1)
            tok_lp = logp.gather(1, toks[:, None])[:, 0].double().cpu()
            greedy = (logp.argmax(-1) == toks).cpu()
            ll.index_add_(0, reqs, tok_lp)
            miss.index_add_(0, reqs, (~greedy).long())
            if on_batch is not None:
                on_batch(len(chunk))
    finally:
        model.train(was_training)
    return ll.tolist(), (miss == 0).tolist()


def loglikelihoods(model: GPT, encode: Callable[[str], list[int]], prefix_id: int,
                   requests: list[tuple[str, str]], batch_size: int = 32, device: torch.device | str = "cpu",
                   precision: str = "fp32", padding_side: str = "right") -> tuple[list[float], list[bool], int]:
    """lm-eval's `loglikelihood` for (context, continuation) strings.

    Returns: (loglikelihood per request in nats, greedy flag per request, number of requests
    whose context was truncated from the left to fit block_size).
    """
    pairs = [encode_pair(encode, c, x, prefix_id) for c, x in requests]
    units, truncated = make_units(pairs, model.config.block_size)
    ll, greedy = score_units(model, units, len(requests), batch_size, device, precision, padding_side)
    return ll, greedy, truncated
