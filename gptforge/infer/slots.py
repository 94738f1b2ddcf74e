"""The slotted key/value cache of the continuous-batching engine (`gptforge.infer.engine`): one
slot of `max_len` positions per sequence, and the rows of one forward pass bound to their slots;
the memory such a cache needs (`kv_cache_bytes`, `kv_cache_excess`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from gptforge.model.gpt import GPT


class SlotBatch:
    """Which cache slots the rows of one forward pass use, computed once and shared by every layer.

    slots (B,) and filled (B,): each row's slot and the positions it has filled before this pass;
    T: the new positions per row. Derived: `pos` (B, T) int64, the absolute positions of the new
    tokens; `S`, the key length every row reads (longest filled + T); `leading` when the rows are
    slots 0..B-1 in order (the cache is then read as a view, no copy); `uniform`, the common filled
    length when every row has the same one (plain slice writes, no index tensors).

    Raises:
        ValueError: a row's positions would run past the slot's `max_len`.
    """

    def __init__(self, slots: list[int], filled: list[int], T: int, max_len: int, device):
        B = len(slots)
        self.T, self.S = T, max(filled) + T
        if self.S > max_len:
            raise ValueError(f"KV cache slot overflow: position {self.S - 1} >= max_len {max_len}")
        self.leading = slots == list(range(B))
        self.uniform = filled[0] if min(filled) == max(filled) else None
        self.slot_idx = torch.tensor(slots, device=device)
        self.pos = torch.tensor(filled, device=device)[:, None] + torch.arange(T, device=device)[None, :]
        self.rows = self.slot_idx[:, None].expand(B, T)


class SlotKVCache:
    """Keys/values of one attention layer for `n_slots` sequences, each with its own length.

    k, v: (n_slots, n_kv_head, max_len, head_dim). Before a forward pass, `bind(batch)` names the
    batch rows' slots and filled lengths (a `SlotBatch`); `update` then writes the new keys of row b
    at positions filled[b].. of slot slots[b] and returns the keys and values of the rows' slots up to
    the longest filled length plus the new ones, (B, n_kv_head, S, head_dim). Positions of a row
    beyond its own length hold stale values: the attention mask must hide them (`Engine` builds
    it). Duck-types `gptforge.model.gpt.KVCache` for `GPT.forward`.
    """

    def __init__(self, n_slots: int, n_kv_head: int, max_len: int, head_dim: int, device, dtype):
        self.k = torch.zeros(n_slots, n_kv_head, max_len, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.pos = 0  # unused: the engine always passes position ids
        self.batch: SlotBatch | None = None

    def bind(self, batch: SlotBatch) -> None:
        """Use `batch`'s slots and lengths for the next `update`."""
        self.batch = batch

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b = self.batch
        assert b is not None, "bind() a SlotBatch before the forward pass"
        B, T, S = k.size(0), b.T, b.S
        k, v = k.to(self.k.dtype), v.to(self.v.dtype)
        if b.uniform is not None:  # equal lengths: slice writes (and, for slots 0..B-1, slice reads)
            L = b.uniform
            if b.leading:
                self.k[:B, :, L:L + T] = k
                self.v[:B, :, L:L + T] = v
                return self.k[:B, :, :S], self.v[:B, :, :S]
            self.k[b.slot_idx, :, L:L + T] = k
            self.v[b.slot_idx, :, L:L + T] = v
        else:
            self.k[b.rows, :, b.pos] = k.transpose(1, 2)
            self.v[b.rows, :, b.pos] = v.transpose(1, 2)
        if b.leading:
            return self.k[:B, :, :S], self.v[:B, :, :S]
        return self.k[b.slot_idx, :, :S], self.v[b.slot_idx, :, :S]

    def copy_positions(self, src: int, dst: int, n: int) -> None:
        """Copy the keys and values of positions 0..n-1 of slot `src` into slot `dst` (a reused prefix)."""
        self.k[dst, :, :n] = self.k[src, :, :n]
        self.v[dst, :, :n] = self.v[src, :, :n]


def kv_cache_bytes(model: GPT, sequences: int, positions: int) -> int:
    """Bytes of the keys and values of `sequences` sequences of `positions` positions each, as
    `SlotKVCache` holds them: 2 x n_layer x (sequences, n_kv_head, positions, head_dim) tensors in the
    dtype of the model's final norm (the compute dtype; a quantized embedding stores int8)."""
    cfg = model.config
    element = model.norm_f.weight.element_size()
    return 2 * cfg.n_layer * sequences * cfg.n_kv_head * positions * cfg.head_dim * element


def kv_cache_excess(model: GPT, sequences: int, positions: int, share: float = 0.8) -> str | None:
    """None when the KV cache of `sequences` x `positions` (`kv_cache_bytes`) fits in `share` of the
    memory of the model's device (or that memory is unknown); else what it needs, what the device
    has and how many sequences would fit, as one clause for an error message."""
    from gptforge.runtime.device import device_memory_bytes

    device = model.norm_f.weight.device
    have = device_memory_bytes(device)
    need = kv_cache_bytes(model, sequences, positions)
    if have is None or need <= share * have:
        return None
    fit = int(share * have) // kv_cache_bytes(model, 1, positions)
    where = "this machine's memory" if device.type == "cpu" else f"the memory of {device}"
    return (f"the KV cache of {sequences} sequences x {positions} positions needs {need / 2**30:,.1f} GiB, more "
            f"than {share:.0%} of {where} ({have / 2**30:,.1f} GiB); at most {fit:,} sequences fit")
