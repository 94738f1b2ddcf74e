"""Batches of token windows read from shard files, deterministic in (seed, step, index).

Every training window is a function of (seed, step, index within the global batch) alone, so:
- a resumed run reads exactly the batches the uninterrupted run would have read;
- the global batch is the same set of sequences whatever the micro-batch size, gradient
  accumulation or data-parallel layout: a rank/micro-batch just takes its slice of indices.

Windows are read with `os.pread` from the shard files (raw little-endian uint16/uint32 ids, the
format `numpy.memmap` reads), so resident memory stays flat over a long run: nothing is mapped,
and only the window's bytes are read.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch


class TokenStream:
    """The concatenation of one split's shard files, addressed by global token offset.

    Args:
        files: shard paths in order.
        dtype: "uint16" or "uint32".
        vocab_size: when given, `read` refuses an id at or above it, naming the file and offset
            (a damaged shard would otherwise fail inside the model's embedding).

    Raises:
        FileNotFoundError: a shard file is missing.
        ValueError: a shard's size is not a multiple of the token size.
    """

    def __init__(self, files: list[str | Path], dtype: str, vocab_size: int | None = None):
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.files = [Path(f) for f in files]
        sizes = []
        for f in self.files:
            if not f.exists():
                raise FileNotFoundError(f"shard file {f} is missing; re-run `gptforge prepare`")
            nbytes = f.stat().st_size
            if nbytes % self.dtype.itemsize:
                raise ValueError(f"shard {f}: {nbytes} bytes is not a multiple of {self.dtype.itemsize} ({dtype})")
            sizes.append(nbytes // self.dtype.itemsize)
        self.sizes = np.array(sizes, dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)])
        self.num_tokens = int(self.starts[-1])
        self._fds: dict[int, int] = {}
        self.vocab_size = vocab_size

    def _fd(self, i: int) -> int:
        fd = self._fds.get(i)
        if fd is None:
            fd = self._fds[i] = os.open(self.files[i], os.O_RDONLY)
        return fd

    def read(self, offset: int, length: int) -> np.ndarray:
        """Tokens [offset, offset+length) across file boundaries, as int64 array (length,).

        Raises:
            DamagedFileError: an id at or above `vocab_size` (when given), naming its file and offset.
        """
        out = np.empty(length, dtype=np.int64)
        pos, filled = offset, 0
        while filled < length:
            i = int(np.searchsorted(self.starts, pos, side="right") - 1)
            local = pos - int(self.starts[i])
            n = min(length - filled, int(self.sizes[i]) - local)
            raw = os.pread(self._fd(i), n * self.dtype.itemsize, local * self.dtype.itemsize)
            out[filled : filled + n] = np.frombuffer(raw, dtype=self.dtype)
            if self.vocab_size is not None and n and int(out[filled:filled + n].max()) >= self.vocab_size:
                from gptforge.data.shard_verify import out_of_vocab_error

                k = int(np.flatnonzero(out[filled:filled + n] >= self.vocab_size)[0])
                raise out_of_vocab_error(self.files[i], local + k, int(out[filled + k]), self.vocab_size)
            filled += n
            pos += n
        return out

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


def window_offsets(seed: int, step: int, global_batch_size: int, num_tokens: int, window: int) -> np.ndarray:
    """Start offsets of the `global_batch_size` windows of optimizer step `step`: int64 (G,).

    Drawn uniformly from [0, num_tokens - window] by a Philox generator keyed on (seed, step), so
    entry i depends only on (seed, step, i) and G.

    Raises:
        ValueError: the split holds fewer than `window` tokens.
    """
    high = num_tokens - window
    if high < 0:
        raise ValueError(
            f"the split has {num_tokens} tokens, fewer than one window of {window} (block_size + 1); "
            "use a smaller model.block_size or more data"
        )
    rng = np.random.Generator(np.random.Philox(key=[seed & (2**64 - 1), step]))
    return rng.integers(0, high + 1, size=global_batch_size, dtype=np.int64)


class TrainBatches:
    """Micro-batches of (inputs, targets), each (micro_batch_size, block_size) int64.

    For optimizer step `step`, the global batch has `global_batch_size` windows; data-parallel rank
    `dp_rank` of `dp_size` owns the contiguous slice [dp_rank*G/dp, (dp_rank+1)*G/dp), cut into
    micro-batches of `micro_batch_size`.
    """

    def __init__(self, stream: TokenStream, block_size: int, micro_batch_size: int,
                 gradient_accumulation_steps: int, seed: int, dp_rank: int = 0, dp_size: int = 1):
        self.stream, self.block_size, self.seed = stream, block_size, seed
        self.micro_batch_size = micro_batch_size
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.global_batch_size = micro_batch_size * gradient_accumulation_steps * dp_size
        # Fail early on a split too small for one window.
        window_offsets(seed, 0, 1, stream.num_tokens, block_size + 1)

    def micro_batches(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The `gradient_accumulation_steps` micro-batches of this rank for `step`."""
        w = self.block_size + 1
        offs = window_offsets(self.seed, step, self.global_batch_size, self.stream.num_tokens, w)
        per_rank = self.micro_batch_size * self.gradient_accumulation_steps
        mine = offs[self.dp_rank * per_rank : (self.dp_rank + 1) * per_rank]
        data = np.stack([self.stream.read(int(o), w) for o in mine])
        t = torch.from_numpy(data)
        out = []
        for m in range(self.gradient_accumulation_steps):
            chunk = t[m * self.micro_batch_size : (m + 1) * self.micro_batch_size]
            out.append((chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()))
        return out


def eval_windows(stream: TokenStream, block_size: int, n_windows: int) -> np.ndarray:
    """Fixed, evenly spaced start offsets of `n_windows` windows over a split: int64 (n,).

    The same set on every evaluation of a run, so val losses are comparable step to step. A split
    holds (N - 1) // block_size windows that share no target (window k starts at k x block_size);
    asked for more than that, it returns those, each once (fewer than n_windows: callers say so),
    rather than repeat windows.
    """
    w = block_size + 1
    high = stream.num_tokens - w
    if high < 0:
        raise ValueError(
            f"the val split has {stream.num_tokens} tokens, fewer than one window of {w}; "
            "use a larger --val-fraction in prepare or a smaller model.block_size"
        )
    held = (stream.num_tokens - 1) // block_size
    if n_windows > held:
        return np.arange(held, dtype=np.int64) * block_size
    return np.linspace(0, high, num=n_windows).round().astype(np.int64)


def document_prefixes(data_dir: str | Path, n_docs: int = 3, n_tokens: int = 6,
                      scan_tokens: int = 65536) -> tuple[str, list[list[int]]]:
    """The first tokens of the first documents of a prepared shard folder, as sample prompts.

    Documents end with meta.json's eos_id. The val split is read when it has tokens, else train;
    only the first `scan_tokens` tokens of the split are scanned, so this is deterministic and
    cheap. A document shorter than 2 tokens (besides its EOS) is skipped; a prefix is at most
    `n_tokens` tokens and at most half its document.

    Returns:
        (split name, list of up to n_docs token-id lists); ("", []) when the folder has no
        meta.json or no usable document.
    """
    import json

    data_dir = Path(data_dir)
    try:
        meta = json.loads((data_dir / "meta.json").read_text())
    except (OSError, ValueError):
        return "", []
    eos = meta.get("eos_id")
    for name in ("val", "train"):
        split = (meta.get("splits") or {}).get(name) or {}
        if not split.get("tokens") or not split.get("files"):
            continue
        try:
            stream = TokenStream([data_dir / f for f in split["files"]], meta["dtype"])
        except (OSError, ValueError):
            continue
        try:
            data = stream.read(0, min(scan_tokens, stream.num_tokens))
        finally:
            stream.close()
        prefixes, start = [], 0
        for end in [*np.flatnonzero(data == eos).tolist(), len(data)]:
            doc = data[start:end].tolist()
            start = end + 1
            if len(doc) >= 2:
                prefixes.append(doc[: min(n_tokens, max(1, len(doc) // 2))])
            if len(prefixes) == n_docs:
                break
        if prefixes:
            return name, prefixes
    return "", []
