"""Token data for compression: calibration batches and a quick validation score of a model.

Both read a shard folder written by `gptforge prepare` (see `gptforge.data.shards`).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from gptforge.errors import InputError


def read_split(data: str | Path, split: str, max_tokens: int | None, tokenizer_sha256: str | None = None) -> np.ndarray:
    """The first `max_tokens` tokens (all with None) of `split` of shard folder `data`, int64 (N,).

    Raises:
        FileNotFoundError: no shard folder at `data`. DamagedFileError: a broken meta.json.
        InputError: the split is empty, or the data was tokenized with another tokenizer than
            `tokenizer_sha256` (the model's).
    """
    from gptforge.data.loader import TokenStream
    from gptforge.data.shards import load_meta
    from gptforge.errors import DamagedFileError

    try:
        meta = load_meta(data)
    except ValueError as e:  # load_meta's own errors: a meta.json that is not a shard folder's
        raise DamagedFileError(str(e)) from e
    if tokenizer_sha256 and meta.get("tokenizer_sha256") and meta["tokenizer_sha256"] != tokenizer_sha256:
        raise InputError(f"{data}: tokenized with another tokenizer (sha256 {meta['tokenizer_sha256'][:12]}) than "
                         f"the model's ({tokenizer_sha256[:12]}); prepare it with the run's tokenizer.json")
    info = meta["splits"].get(split)
    if not info or not info.get("tokens"):
        raise InputError(f"{Path(data) / 'meta.json'}: split {split!r} is empty")
    stream = TokenStream([Path(data) / f for f in info["files"]], meta["dtype"])
    n = stream.num_tokens if max_tokens is None else min(max_tokens, stream.num_tokens)
    tokens = stream.read(0, n).astype(np.int64)
    stream.close()
    return tokens


def calibration_batches(tokens: np.ndarray, block_size: int, batch_size: int, num_batches: int,
                        option: str = "--calibration") -> list[torch.Tensor]:
    """Up to `num_batches` disjoint batches (batch_size, block_size) int64 cut from `tokens` in order.

    Raises:
        InputError: fewer tokens than one batch (batch_size * block_size + 1), naming `option`.
    """
    per_batch = batch_size * block_size
    if len(tokens) < per_batch + 1:
        raise InputError(f"{option}: {len(tokens)} tokens is smaller than one calibration batch "
                         f"({batch_size} x {block_size} = {per_batch} tokens); give more data or a smaller "
                         "--calibration-batch-size")
    n = min(num_batches, (len(tokens) - 1) // per_batch)
    t = torch.as_tensor(tokens[: n * per_batch]).view(n, batch_size, block_size)
    return list(t.unbind(0))


@torch.no_grad()
def forward_ms(model: torch.nn.Module, batch: torch.Tensor, repeats: int = 5) -> float:
    """Median wall time of one forward pass of `batch` (B, T), in milliseconds (one warm-up first)."""
    model(batch)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        model(batch)
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def tensor_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's state (parameters and persistent buffers), shared tensors counted once."""
    seen, total = set(), 0
    for v in model.state_dict().values():
        key = (v.untyped_storage().data_ptr(), v.dtype, tuple(v.shape))
        if key in seen:
            continue
        seen.add(key)
        total += v.numel() * v.element_size()
    return total


def folder_bytes(path: Path) -> int:
    """Bytes of all files under `path`."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())
