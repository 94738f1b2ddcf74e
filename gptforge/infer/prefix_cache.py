"""Prefix reuse for the continuous-batching engine: a prompt that starts with tokens whose keys and
values some cache slot still holds skips their prefill (the prompt cache of llama.cpp's server
slots; vLLM's automatic prefix caching does the same over pages).

What a slot holds: every slot of the engine's `SlotKVCache` has, at positions 0..n-1, the keys and
values of some token sequence:
- a running sequence's slot: its prompt and generated tokens, all but the newest (not fed yet);
- a free slot: what its last sequence had written when it ended, until another sequence takes it;
- a spare slot (`n_spare` slots beyond the engine's max_batch_size, memory spent only on this
  cache): the content of a free slot saved just before a sequence overwrote it.

At admission (`PrefixCache.plan`) a request has taken the engine's lowest free slot. The slot
whose tokens share the longest common prefix with its prompt is the source: its first L positions
are copied into the request's slot (no copy when the source is that slot) and the prefill starts at
position L, where L = min(common prefix, len(prompt) - 1): at least one prompt token is fed, for the
logits of the first generated token. A key or value depends only on the tokens up to its position,
so the reused ones equal a fresh prefill's up to float rounding (another pass's matrix products).

Bound and eviction: the cache holds at most max_batch_size + n_spare token sequences and no memory
beyond the spare slots. Before a free slot is overwritten by a request that does not reuse all of
it, its content moves to a spare slot unless a spare already holds it (or a longer sequence starting
with it); the spare replaced is an empty one or one whose content is a prefix of the saved sequence,
else the least recently used (stored, or read as a source). Requests with prompt_logprobs neither
reuse a prefix (they need the logits of every prompt position) nor are kept from being reused.
Sequences admitted in the same step do not reuse each other's prompts (none is written yet). With
LoRA adapters served by name (`gptforge.infer.multi_lora`), a slot is reused only by requests of the
adapter (or the base) that wrote it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gptforge.infer.slots import SlotKVCache


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The number of leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]: bisect on list slices (C speed)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def written_tokens(seq: Any) -> list[int]:
    """The tokens whose keys and values an engine `Request` has written into its slot, in order:
    none before its prefill, then its prompt and every generated token but the newest."""
    if not seq.prefilled:
        return []
    return seq.prompt + seq.generated[:-1]


class PrefixCache:
    """Which token sequence each slot of an engine's cache holds, and the reuse of their prefixes
    (see the module docstring).

    Args:
        layers: the engine's per-layer `SlotKVCache`s, each of n_batch + n_spare slots.
        n_batch: the engine's slots for running sequences (0..n_batch-1).
        n_spare: slots n_batch.. that only keep prefixes.
        enabled: False: no reuse, no copies (every prompt is prefilled from position 0).
    """

    def __init__(self, layers: list[SlotKVCache], n_batch: int, n_spare: int = 0, enabled: bool = True):
        self.layers, self.n_batch, self.n_spare, self.enabled = layers, n_batch, n_spare, enabled
        self.tokens: list[list[int]] = [[] for _ in range(n_batch + n_spare)]  # of free and spare slots
        self.adapters: list[Any] = [None] * (n_batch + n_spare)  # the LoRA adapter that wrote each slot
        self.used = [0] * (n_batch + n_spare)
        self.clock = 0

    def plan(self, seq: Any, running: Sequence[Any]) -> int:
        """Choose and copy the reused prefix of `seq` (an engine Request that holds its slot, not
        prefilled yet), given the `running` sequences (their slots' written tokens count as cached).
        Sets and returns seq.cached: how many leading prompt positions its slot now holds."""
        dst = seq.slot
        seq.cached = 0
        if not self.enabled:
            return 0
        self.clock += 1
        best, n = dst, 0
        if seq.params.prompt_logprobs is None:  # keys and values depend on the adapter: only its own are reused
            adapter = seq.params.adapter
            sources = {s: t for s, t in enumerate(self.tokens) if t and self.adapters[s] is adapter}
            sources.update({r.slot: written_tokens(r) for r in running
                            if r.slot is not None and r.params.adapter is adapter})
            for slot, toks in sources.items():
                m = common_prefix(seq.prompt, toks)
                if m > n or (m == n and slot == dst):
                    best, n = slot, m
        n = min(n, len(seq.prompt) - 1)
        if best != dst or n < len(self.tokens[dst]):  # dst's content (or its tail) is about to be overwritten
            self._save(dst, keep=best)
            best = best if n > 0 else dst
        if best != dst:
            for c in self.layers:
                c.copy_positions(best, dst, n)
        self.used[best] = self.clock
        self.tokens[dst] = []  # the slot belongs to `seq` now: `running` describes it
        seq.cached = n
        return n

    def release(self, seq: Any) -> None:
        """`seq` leaves its slot: the slot keeps what it wrote, for later prompts to reuse."""
        if self.enabled and seq.slot is not None:
            self.clock += 1
            self.tokens[seq.slot] = written_tokens(seq)
            self.adapters[seq.slot] = seq.params.adapter
            self.used[seq.slot] = self.clock

    def clear(self) -> None:
        """Forget every slot's content (after a failed step, whose writes may be partial)."""
        self.tokens = [[] for _ in self.tokens]
        self.adapters = [None] * len(self.tokens)

    def _save(self, slot: int, keep: int) -> None:
        """Copy free slot `slot`'s content to a spare slot other than `keep`, when worth keeping."""
        toks = self.tokens[slot]
        if self.n_spare == 0 or len(toks) < 2:
            return
        spares = [s for s in range(self.n_batch, self.n_batch + self.n_spare) if s != keep]
        tag = self.adapters[slot]
        if any(self.tokens[s][:len(toks)] == toks and self.adapters[s] is tag for s in range(self.n_batch, len(self.tokens))):
            return  # a spare holds it already, or a longer sequence that starts with it
        covered = [s for s in spares if toks[:len(self.tokens[s])] == self.tokens[s]
                   and (self.adapters[s] is tag or not self.tokens[s])]  # empty ones included
        if covered:
            target = covered[0]
        elif spares:
            target = min(spares, key=lambda s: self.used[s])
        else:
            return
        for c in self.layers:
            c.copy_positions(slot, target, len(toks))
        self.tokens[target], self.used[target], self.adapters[target] = list(toks), self.clock, tag


def prefill_groups(seqs: Sequence[Any], max_len: int) -> list[list[Any]]:
    """Split sequences about to be prefilled into forward passes: each pass right-pads the rows'
    uncached prompt tails to the longest, so a pass must keep max(cached) + longest tail <=
    max_len (positions per slot). Rows sorted by cached length, greedily packed."""
    groups: list[list[Any]] = []
    hi_cached = hi_tail = 0
    for s in sorted(seqs, key=lambda s: s.cached):
        tail = len(s.prompt) - s.cached
        if groups and max(hi_cached, s.cached) + max(hi_tail, tail) <= max_len:
            groups[-1].append(s)
            hi_cached, hi_tail = max(hi_cached, s.cached), max(hi_tail, tail)
        else:
            groups.append([s])
            hi_cached, hi_tail = s.cached, tail
    return groups
