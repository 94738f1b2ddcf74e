"""The engine's compiled static-shape decode step (`Engine(compile_decode=True)`, `serve --compile`).

The engine's eager decode pass reads each row's slot up to the longest filled length S, which grows
every step: a compiled forward would need symbolic shapes or a recompile per token. As
`gptforge.infer.static_decode` does for `generate --compile`, the step here reads the rows' slots
at a bucket length L (a power of two >= S, at most max_model_len; `bucket_length`) with a mask over
each row's unfilled and stale positions (keys it may not see get softmax weight exactly 0, so the
attention is the eager one up to float rounding), and takes the positions and slots as tensors. Its
shapes are then fixed per (rows B, bucket L, rows in slots 0..B-1 or not): one graph per such key,
compiled on first use with `torch.compile(fullgraph=True, dynamic=False)`, linear layers over one or
two rows traced as multiply-and-sum reductions (`RowMatvec`). A stream of n tokens compiles at most
log2(n) + 1 graphs per batch size; Inductor caches them on disk across processes.

Prefill, speculative (multi-token) passes and batches with LoRA adapters stay eager; the compiled
step covers the one-token decode pass. With `compile=False` the same static-shape function runs
eagerly (tests check its logic without paying the compile).
"""

from __future__ import annotations

from typing import Any

import torch

from gptforge.infer.static_decode import RowMatvec, bucket_length


class _SlotRows:
    """The `KVCache` interface over one layer's `SlotKVCache` for one static step: writes the new key
    and value (B, n_kv_head, 1, head_dim) of row b at position pos[b] of slot slots[b], and returns the
    rows' slots read at L positions, (B, n_kv_head, L, head_dim) (a view when the rows are slots
    0..B-1)."""

    pos = 0  # unused: the step passes position ids and a mask

    def __init__(self, cache: Any, slots: torch.Tensor, pos: torch.Tensor, length: int, leading: bool):
        self.cache, self.slots, self.pos_t, self.length, self.leading = cache, slots, pos, length, leading

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ck, cv, L = self.cache.k, self.cache.v, self.length
        ck[self.slots, :, self.pos_t] = k[:, :, 0].to(ck.dtype)
        cv[self.slots, :, self.pos_t] = v[:, :, 0].to(cv.dtype)
        if self.leading:
            B = self.slots.size(0)
            return ck[:B, :, :L], cv[:B, :, :L]
        return ck.index_select(0, self.slots)[:, :, :L], cv.index_select(0, self.slots)[:, :, :L]


class CompiledDecode:
    """One-token decode passes of an engine through static-shape steps, one per (B, L, leading).

    Args:
        model: the engine's GPT (eval mode).
        caches: the engine's `SlotKVCache`s, one per layer.
        max_model_len: positions per slot (the largest bucket).
        compile: torch.compile each step (False: run the same static-shape function eagerly).
    """

    def __init__(self, model: Any, caches: list, max_model_len: int, compile: bool = True):
        self.model, self.caches, self.max_model_len, self.compile = model, caches, max_model_len, compile
        self.device = caches[0].k.device
        self.steps: dict[tuple[int, int, bool], Any] = {}
        self.fullgraph = True

    def __call__(self, last: list[int], filled: list[int], slots: list[int]) -> torch.Tensor:
        """Feed row b its token last[b] at position filled[b] of slot slots[b]; returns the logits (B, V)."""
        B = len(last)
        L = bucket_length(max(filled) + 1, self.max_model_len)
        leading = slots == list(range(B))
        key = (B, L, leading)
        step = self.steps.get(key)
        if step is None:
            step = self.steps[key] = self._build(L, leading)
        idx = torch.tensor(last, dtype=torch.long, device=self.device)[:, None]
        pos = torch.tensor(filled, dtype=torch.long, device=self.device)
        slot_t = torch.tensor(slots, dtype=torch.long, device=self.device)
        try:
            return step(idx, pos, slot_t)
        except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.FailOnRecompileLimitHit):
            # A layer Dynamo cannot trace in one graph (nothing ran yet): compile with graph breaks.
            if not self.fullgraph:
                raise
            self.fullgraph = False
            self.steps.clear()
            step = self.steps[key] = self._build(L, leading)
            return step(idx, pos, slot_t)

    def _build(self, length: int, leading: bool):
        model, caches = self.model, self.caches
        arange = torch.arange(length, device=self.device)

        def step(idx: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
            rows = [_SlotRows(c, slots, pos, length, leading) for c in caches]
            mask = (arange[None, :] <= pos[:, None])[:, None, None, :]  # (B, 1, 1, L): own positions only
            with RowMatvec():
                logits = model(idx, position_ids=pos[:, None], attn_mask=mask, caches=rows, last_only=True)
            return logits[:, -1]

        if not self.compile:
            return step
        return torch.compile(step, fullgraph=self.fullgraph, dynamic=False,  # type: ignore[call-overload]
                             options={"cpp_wrapper": True}, isolate_recompiles=True)
