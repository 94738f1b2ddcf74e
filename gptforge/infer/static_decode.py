"""A static-shape decode step: one compiled graph per (batch, cache length bucket).

`GPT.forward` over a growing `KVCache` sees a new key length every token, so a compiled forward
needs symbolic shapes (guards, size arithmetic) or a recompile per length. Here the cache is read
at its full allocated length L every step, with a mask over the positions not filled yet
(masked keys get softmax weight exactly 0, so the attention equals the one over the filled
prefix up to float rounding), and the filled length lives in a tensor that the step itself
advances. Every step then has the same shapes and takes no Python-built tensors: the one-token
step is compiled once with static shapes (`torch.compile(fullgraph=True, dynamic=False)`) and
called with the last token ids only. L is a bucket, a power of two (at least 16, at most
block_size), so a short generation does not attend over the whole block.

The prefill runs the model eagerly over the same buffers (`KVCache` views), so its logits are
eager's exactly.

At one or two rows the step's linear layers are traced as multiply-and-sum reductions
(`RowMatvec`), which Inductor compiles into one loop that streams each weight once; a one-row
`F.linear` goes to the BLAS matrix product instead, which reads the weights at a lower rate.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from gptforge.model.gpt import GPT, KVCache

MIN_BUCKET = 16

MATVEC_MAX_ROWS = 2
"""Up to this many rows `RowMatvec` rewrites a linear layer. Measured on a 2-core AMD EPYC (one
thread, fp32, 48 weights of 3072 x 768 that do not fit in cache): `F.linear` read 12.4 GB/s at 1
row and 6.2 at 2, the compiled reduction 19.3 and 11.2; at 4 rows the two were even (6.6 / 6.3)."""


class RowMatvec(TorchFunctionMode):
    """While Dynamo traces (and only then), `F.linear(x, W, b)` over at most `MATVEC_MAX_ROWS` rows
    of x (..., in) with a 2-D W (out, in) becomes `(x[:, None, :] * W).sum(-1) + b`, shape (..., out).

    The product is the same up to float rounding (the sum runs in another order; Inductor accumulates
    bf16 in fp32). Outside a trace every call passes through unchanged: run eagerly, the rewrite would
    build an (out, in) temporary per row. With it, `generate(compile=True)` on gpt2-small fp32 went
    from 30 to 40-41 tokens/s on a 2-core AMD EPYC at one thread (bench/serve_throughput.py; the
    figures with their references are in bench/RESULTS.md).
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and torch.compiler.is_compiling():
            x, w = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            rows = x.numel() // max(1, x.shape[-1])
            if w.dim() == 2 and 0 < rows <= MATVEC_MAX_ROWS:
                # one row as a 2-D product: Inductor's loop for the (1, out, in) form read slower
                prod = x.reshape(1, -1) * w if rows == 1 else x.reshape(rows, 1, -1) * w
                y = prod.sum(-1).reshape(*x.shape[:-1], w.shape[0])
                return y if bias is None else y + bias
        return func(*args, **kwargs)


def bucket_length(needed: int, block_size: int) -> int:
    """The cache length for `needed` positions: the smallest power of two >= needed (at least
    MIN_BUCKET), capped at block_size.

    Raises:
        ValueError: needed > block_size (the caller's window rule keeps it within the block).
    """
    if needed > block_size:
        raise ValueError(f"a static KV cache of {needed} positions exceeds model.block_size {block_size}")
    n = MIN_BUCKET
    while n < needed:
        n *= 2
    return min(n, block_size)


class StaticKVCache:
    """The `KVCache` interface over full-length buffers, for the static decode step.

    k, v: (B, n_kv_head, L, head_dim), shared with the prefill's `KVCache`. index: (1,) int64,
    the position this step writes (shared by every layer; the step advances it). `update` writes
    k, v (B, n_kv_head, 1, head_dim) there and returns the whole buffers (B, n_kv_head, L, hd):
    the caller's attention mask hides the positions not yet written.
    """

    def __init__(self, cache: KVCache, index: torch.Tensor):
        self.k, self.v, self.index = cache.k, cache.v, index
        self.pos = 0  # unused: the step always passes position ids and a mask

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k.index_copy_(2, self.index, k.to(self.k.dtype))
        self.v.index_copy_(2, self.index, v.to(self.v.dtype))
        return self.k, self.v


class StaticDecoder:
    """Prefill + compiled static one-token steps for `batch` rows and a cache of `length` positions.

    Built once per (model, batch, length, dtype, device) by `static_decoder`; reused by every
    generation of that shape (the buffers are reset by `prefill`). The compiled step reads the
    model's current weights, so loading new weights needs no rebuild.

    Usage: `logits = dec.prefill(idx, position_ids, attn_mask, pads)` then, per token,
    `logits = dec.step(last)`; logits are (B, V). One generation at a time per decoder: the
    buffers are its state, so two threads decoding the same model and shape at once would mix.
    """

    def __init__(self, model: GPT, batch: int, length: int, options: dict | None = None):
        self.model, self.batch, self.length = model, batch, length
        self.caches = model.make_caches(batch, length)
        device = self.caches[0].k.device
        self.index = torch.zeros(1, dtype=torch.long, device=device)
        self.pad = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.static = [StaticKVCache(c, self.index) for c in self.caches]
        self.arange = torch.arange(length, device=device)
        self.filled = 0  # Python's copy of `index`: checking it costs no tensor read
        # Inductor's C++ wrapper calls the kernels from C++: measured ~3x fewer seconds per token
        # than its Python wrapper on a 1 M-parameter model, whose decode step is all call overhead.
        self.options = {"cpp_wrapper": True} if options is None else options
        self.fullgraph = True
        self._compiled = self._compile()

    def prefill(self, idx: torch.Tensor, position_ids: torch.Tensor | None, attn_mask: torch.Tensor | None,
                pads: list[int]) -> torch.Tensor:
        """Run the window idx (B, W) (left-padded by `pads`, with `padded_batch`'s position ids and
        mask) eagerly into the buffers; returns the last position's logits (B, V).

        Raises:
            ValueError: W > length.
        """
        W = idx.size(1)
        if W > self.length:
            raise ValueError(f"a window of {W} tokens does not fit in a static cache of {self.length}")
        for c in self.caches:
            c.pos = 0
        logits = self.model(idx, position_ids=position_ids, attn_mask=attn_mask, caches=self.caches, last_only=True)
        self.index.fill_(W)
        self.filled = W
        self.pad.copy_(torch.tensor(pads, dtype=torch.long)[:, None])
        return logits[:, -1]

    def step(self, last: torch.Tensor) -> torch.Tensor:
        """One token per row, last (B, 1) int64 -> next-token logits (B, V); advances the filled
        length by one.

        Raises:
            ValueError: the cache is full (the caller re-prefills a shorter window first).
        """
        if self.filled >= self.length:
            raise ValueError(f"the static KV cache of {self.length} positions is full")
        try:
            logits = self._compiled(last)
        except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.FailOnRecompileLimitHit):
            # A layer Dynamo cannot trace in one graph, or more graphs than Dynamo's recompile
            # limit (tracing failed before anything ran): compile with graph breaks instead,
            # still with static shapes (past the limit that runs eagerly, with Dynamo's warning).
            if not self.fullgraph:
                raise
            self.fullgraph = False
            self._compiled = self._compile()
            logits = self._compiled(last)
        self.filled += 1
        return logits

    def _compile(self):
        # isolate_recompiles: every decoder's graph counts against its own recompile limit, not
        # against one limit shared by all decoders (all compile the same `_step` code).
        return torch.compile(self._step, fullgraph=self.fullgraph, dynamic=False, options=self.options,
                             isolate_recompiles=True)  # type: ignore[call-overload]  # not in torch 2.13's overload stubs

    def _step(self, last: torch.Tensor) -> torch.Tensor:
        # Keys 0..index are filled; a left-padded row's keys before its padding count are not real.
        mask = (self.arange <= self.index) & (self.arange[None, :] >= self.pad)  # (B, L)
        with RowMatvec():
            logits = self.model(last, position_ids=self.index - self.pad, attn_mask=mask[:, None, None, :],
                                caches=self.static, last_only=True)
        self.index.add_(1)
        return logits[:, -1]


_DECODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""model -> {(batch, length, dtype, device): StaticDecoder}; not a submodule, so never in the
state_dict. A decoder refers to its model, so an entry (model, buffers, compiled step) lives as
long as the process."""


def static_decoder(model: GPT, batch: int, length: int) -> StaticDecoder:
    """The cached `StaticDecoder` of `model` for `batch` rows and a cache of `length` positions
    (see `bucket_length`), built on first use; its first `step` compiles (seconds on a CPU,
    cached on disk by Inductor)."""
    p = model.norm_f.weight
    key = (batch, length, p.dtype, p.device)
    per_model = _DECODERS.setdefault(model, {})
    if key not in per_model:
        per_model[key] = StaticDecoder(model, batch, length)
    return per_model[key]
