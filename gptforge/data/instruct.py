"""Instruction data: .jsonl -> token ids with a completion-only loss mask -> packed or padded batches.

The rows and how each becomes token ids with target flags (prompt/completion, chat messages in
the tokenizer's chat template or the default one) are `gptforge.data.chat`'s; this module reads
the file (skipping bad rows with a warning, caching the tokenized result beside it) and arranges
the examples into batches.

Batches (`InstructionDataset`): `packed` puts several sequences in each row of `block_size` tokens
with attention kept inside each sequence (a block-diagonal causal bool mask for `GPT.forward`'s
`attn_mask`) and position ids restarting at 0 per sequence; `padded` puts one sequence per row,
right-padded. Both give the same per-token losses (tested). Labels are -100 where no loss counts.
"""

from __future__ import annotations

import bisect
import json
import warnings
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Iterable, Iterator, Literal

import numpy as np
import torch

from gptforge.data.chat import ChatTokenizer, Example, render_example
from gptforge.errors import InputError
from gptforge.runtime.loss import (
    IGNORE_INDEX,  # labels of positions that count for no loss
)

# ---------------------------------------------------------------------------------------------
# Reading a .jsonl (bad rows skipped, the tokenized result cached beside it)


def _warn_skipped(path: Path, errors: list[str], kept: int) -> None:
    """Warn that `errors` rows of `path` were skipped (first five named by file:line)."""
    if errors:
        shown = "\n  ".join(errors[:5]) + (f"\n  ... and {len(errors) - 5} more" if len(errors) > 5 else "")
        warnings.warn(f"{path}: skipped {len(errors)} bad row(s) of {len(errors) + kept}:\n  {shown}", stacklevel=3)


def read_jsonl(path: str | Path, errors: list[str] | None = None) -> Iterator[tuple[str, dict]]:
    """(file:line, object) for each non-blank line.

    With `errors` (a list), a line that is not JSON is skipped and its message appended there
    instead of raised.

    Raises:
        FileNotFoundError: no file. ValueError: a line that is not JSON (file:line), without `errors`.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such instruction file (.jsonl with prompt/completion or messages)")
    from gptforge.data.readers import sniff_binary

    with open(path, "rb") as fb:
        why = sniff_binary(fb.read(64 * 1024))
    if why:
        raise InputError(f"{path}: a binary file ({why}), not an instruction .jsonl; give a UTF-8 .jsonl with "
                         "prompt/completion or messages rows")
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{n}", json.loads(line)
            except json.JSONDecodeError as e:
                message = f"{path}:{n}: not valid JSON ({e.msg.removesuffix(' at')} at column {e.colno})"
                if errors is None:
                    raise ValueError(message) from None
                errors.append(message)


CACHE_VERSION = 1


def _cache_key(path: Path, tok: ChatTokenizer, template: str | None) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    h.update(tok.tokenizer.to_str().encode())
    h.update(json.dumps([CACHE_VERSION, template, tok.chat_template, tok.bos_token, tok.eos_token, tok.add_bos,
                         sorted(tok.extra_tokens.items())]).encode())
    return h.hexdigest()[:16]


def load_examples(path: str | Path, tok: ChatTokenizer, template: str | None = None,
                  cache: bool = True) -> list[Example]:
    """Tokenize every row of a .jsonl (progress bar on stderr), or read the cached result.

    The cache sits beside the data: `<name>.jsonl.gptforge-<key>.npz`, key = hash of the file's
    bytes, the tokenizer, its template settings and `template`; any change makes a new one. It is
    written atomically (temp file, fsync, rename); a folder that is not writable just skips it.

    Raises:
        FileNotFoundError, ValueError: see `read_jsonl` and `render_example` (file:line).
    """
    import os
    import tempfile

    from gptforge.progress import progress

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such instruction file (.jsonl with prompt/completion or messages)")
    cache_path = path.with_name(f"{path.name}.gptforge-{_cache_key(path, tok, template)}.npz") if cache else None
    if cache_path is not None and cache_path.is_file():
        with np.load(cache_path) as z:
            ids, target, offsets = z["ids"].tolist(), z["target"].astype(bool).tolist(), z["offsets"].tolist()
            cached_errors = z["errors"].tolist() if "errors" in z.files else []
        examples = [Example(ids[a:b], target[a:b]) for a, b in pairwise(offsets)]
        _warn_skipped(path, cached_errors, len(examples))  # the cache remembers what it skipped
        return examples
    examples = []
    errors: list[str] = []
    with progress(f"tokenizing {path.name}", path.stat().st_size, "bytes") as bar:
        for where, row in read_jsonl(path, errors):
            # A bad row is skipped with a warning and counted, as prepare does with bad records.
            try:
                examples.append(render_example(tok, row, template, where))
            except ValueError as e:
                errors.append(str(e))
            bar.advance(len(json.dumps(row)) + 1)
    if errors and not examples:
        shown = "\n  ".join(errors[:5]) + (f"\n  ... and {len(errors) - 5} more" if len(errors) > 5 else "")
        raise ValueError(f"{path}: no usable row; {len(errors)} bad row(s):\n  {shown}")
    _warn_skipped(path, errors, len(examples))
    if cache_path is not None:
        offsets = np.cumsum([0] + [len(e.ids) for e in examples], dtype=np.int64)
        flat_ids = np.fromiter((i for e in examples for i in e.ids), dtype=np.int64, count=int(offsets[-1]))
        flat_target = np.fromiter((t for e in examples for t in e.target), dtype=np.uint8, count=int(offsets[-1]))
        try:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{cache_path.name}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    np.savez(f, ids=flat_ids.astype(np.uint32), target=flat_target, offsets=offsets,
                             errors=np.array(errors, dtype=str))
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, cache_path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError:
            pass  # read-only data folder: tokenize again next time
    return examples


# ---------------------------------------------------------------------------------------------
# Batches


@dataclass
class Sequence:
    """Training pair of one example: inputs (n,) and labels (n,) (IGNORE_INDEX where no loss)."""

    inputs: np.ndarray
    labels: np.ndarray


def to_sequence(ex: Example, block_size: int) -> tuple[Sequence | None, bool]:
    """Shift one example into (inputs, labels), truncated to block_size tokens.

    Returns (sequence or None when it has no target left, whether it was truncated).
    """
    ids = np.asarray(ex.ids, dtype=np.int64)
    target = np.asarray(ex.target, dtype=bool)
    truncated = len(ids) > block_size + 1
    ids, target = ids[: block_size + 1], target[: block_size + 1]
    if len(ids) < 2 or not target[1:].any():
        return None, truncated
    labels = np.where(target[1:], ids[1:], IGNORE_INDEX)
    return Sequence(ids[:-1], labels), truncated


def pack_sequences(lengths: list[int], block_size: int) -> list[list[int]]:
    """Best-fit-decreasing bin packing: lists of sequence indices whose lengths sum <= block_size.

    Deterministic (ties keep index order). Bins come out in order of creation.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # sorted (room left, bin index)
    for i in order:
        n = lengths[i]
        k = bisect.bisect_left(free, (n, -1))
        if k < len(free):
            room, b = free.pop(k)
        else:
            room, b = block_size, len(bins)
            bins.append([])
        bins[b].append(i)
        room -= n
        if room > 0:
            bisect.insort(free, (room, b))
    return bins


def block_causal_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """Bool (B, 1, T, T) mask, True = may attend: causal and within the same document.

    doc_ids: (B, T) int, equal ids = same packed sequence (padding gets its own id).
    """
    T = doc_ids.size(-1)
    same = doc_ids[:, :, None] == doc_ids[:, None, :]
    causal = torch.ones(T, T, dtype=torch.bool, device=doc_ids.device).tril()
    return (same & causal)[:, None]


@dataclass
class InstructionDataset:
    """Tokenized instruction examples arranged as rows of a batch.

    Build with `InstructionDataset.from_jsonl(path, tokenizer, block_size, mode)`. `len(ds)` rows;
    `ds.batch(indices)` returns tensors:
      input_ids (B, T) int64, labels (B, T) int64 (IGNORE_INDEX where no loss counts),
      position_ids (B, T) int64, attn_mask (B, 1, T, T) bool or None (padded: causal suffices),
    with T = block_size (packed) or the longest sequence of the batch (padded).
    Stats: examples, dropped_no_target, truncated, target_tokens.
    """

    sequences: list[Sequence]
    block_size: int
    mode: Literal["packed", "padded"] = "packed"
    pad_id: int = 0
    rows: list[list[int]] = field(default_factory=list)
    stats: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.mode not in ("packed", "padded"):
            raise ValueError(f"instruction data mode must be 'packed' or 'padded', got {self.mode!r}")
        if not self.rows:
            if self.mode == "packed":
                self.rows = pack_sequences([len(s.inputs) for s in self.sequences], self.block_size)
            else:
                self.rows = [[i] for i in range(len(self.sequences))]

    @classmethod
    def from_examples(cls, examples: Iterable[Example], block_size: int, mode: Literal["packed", "padded"] = "packed",
                      pad_id: int | None = None) -> "InstructionDataset":
        """Shift, truncate (to block_size) and arrange examples; pad_id defaults to 0."""
        seqs, stats = [], {"examples": 0, "dropped_no_target": 0, "truncated": 0, "target_tokens": 0}
        for ex in examples:
            stats["examples"] += 1
            seq, truncated = to_sequence(ex, block_size)
            stats["truncated"] += int(truncated)
            if seq is None:
                stats["dropped_no_target"] += 1
                continue
            stats["target_tokens"] += int((seq.labels != IGNORE_INDEX).sum())
            seqs.append(seq)
        return cls(seqs, block_size, mode, pad_id or 0, stats=stats)

    @classmethod
    def from_jsonl(cls, path: str | Path, tokenizer: ChatTokenizer, block_size: int, 
                   mode: Literal["packed", "padded"] = "packed",
                   template: str | None = None, cache: bool = True) -> "InstructionDataset":
        """Read and tokenize a .jsonl of prompt/completion or messages rows (see `load_examples`
        for the cache beside it).

        Raises:
            FileNotFoundError, ValueError: a missing file; a file with no usable or trainable row
                (bad rows among good ones are skipped with a warning naming file:line).
        """
        examples = load_examples(path, tokenizer, template, cache)
        ds = cls.from_examples(examples, block_size, mode, pad_id=tokenizer.eos_id)
        if not ds.sequences:
            raise ValueError(f"{path}: no example with a completion token within block_size {block_size}")
        return ds

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self, indices: Iterable[int]) -> dict[str, torch.Tensor | None]:
        """The rows `indices` as one batch (see the class docstring for shapes)."""
        rows = [self.rows[i] for i in indices]
        if self.mode == "padded":
            T = max(len(self.sequences[r[0]].inputs) for r in rows)
        else:
            T = self.block_size
        B = len(rows)
        input_ids = np.full((B, T), self.pad_id, dtype=np.int64)
        labels = np.full((B, T), IGNORE_INDEX, dtype=np.int64)
        position_ids = np.zeros((B, T), dtype=np.int64)
        doc_ids = np.full((B, T), -1, dtype=np.int64)
        for b, row in enumerate(rows):
            t = 0
            for d, i in enumerate(row):
                s = self.sequences[i]
                n = len(s.inputs)
                input_ids[b, t:t + n] = s.inputs
                labels[b, t:t + n] = s.labels
                position_ids[b, t:t + n] = np.arange(n)
                doc_ids[b, t:t + n] = d
                t += n
            # Padding: positions from 0, and its own "document" (id -1) so that no row of the mask
            # is all False (SDPA would return NaN there).
            position_ids[b, t:] = np.arange(T - t)
        out = {
            "input_ids": torch.from_numpy(input_ids),
            "labels": torch.from_numpy(labels),
            "position_ids": torch.from_numpy(position_ids),
            "attn_mask": None,
        }
        if self.mode == "packed":
            out["attn_mask"] = block_causal_mask(torch.from_numpy(doc_ids))
        return out


class EpochOrder:
    """The order a training loop reads N items in, deterministic in (seed, step, index).

    Global batch entry i of optimizer step `step` is item perm_e[g mod N] with g = step*G + i,
    e = g // N (the epoch) and perm_e a Philox permutation keyed on (seed, e): every item is seen
    once per epoch, a resumed run reads exactly what the uninterrupted one would have, and the
    global batch is the same whatever micro_batch_size x gradient_accumulation_steps x dp_size.
    Data-parallel rank `dp_rank` owns the contiguous slice [dp_rank*G/dp, (dp_rank+1)*G/dp).

    Raises:
        ValueError: no items (`empty` says what is missing).
    """

    def __init__(self, n: int, micro_batch_size: int, gradient_accumulation_steps: int, seed: int,
                 dp_rank: int = 0, dp_size: int = 1, empty: str = "no items"):
        if n == 0:
            raise ValueError(empty)
        self.n, self.seed = n, seed
        self.micro_batch_size = micro_batch_size
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.global_batch_size = micro_batch_size * gradient_accumulation_steps * dp_size
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            rng = np.random.Generator(np.random.Philox(key=[self.seed & (2**64 - 1), epoch]))
            perm = rng.permutation(self.n)
            self._perms = {epoch: perm}  # keep one epoch's permutation
        return perm

    def rows(self, step: int) -> np.ndarray:
        """Item indices of the whole global batch of `step`: int64 (global_batch_size,)."""
        n = self.n
        g = step * self.global_batch_size + np.arange(self.global_batch_size, dtype=np.int64)
        return np.array([self._perm(int(e))[int(r)] for e, r in zip(g // n, g % n, strict=True)], dtype=np.int64)

    def rank_rows(self, step: int) -> np.ndarray:
        """This rank's slice of `rows(step)`: int64 (micro_batch_size * gradient_accumulation_steps,)."""
        per_rank = self.micro_batch_size * self.gradient_accumulation_steps
        return self.rows(step)[self.dp_rank * per_rank:(self.dp_rank + 1) * per_rank]


class InstructionBatches(EpochOrder):
    """Micro-batches of instruction rows for the training loop, deterministic in (seed, step, index).

    Rows in `EpochOrder`'s order: each row once per epoch, the same global batch on any layout.

    `micro_batches(step)` returns `gradient_accumulation_steps` dicts as `InstructionDataset.batch`
    makes them (input_ids, labels, position_ids, attn_mask); the model is called as
    `model(input_ids, position_ids=position_ids, attn_mask=attn_mask)` and the loss counts the
    labels != IGNORE_INDEX.
    """

    def __init__(self, ds: InstructionDataset, micro_batch_size: int, gradient_accumulation_steps: int,
                 seed: int, dp_rank: int = 0, dp_size: int = 1):
        super().__init__(len(ds), micro_batch_size, gradient_accumulation_steps, seed, dp_rank, dp_size,
                         empty="instruction dataset has no rows")
        self.ds = ds

    def micro_batches(self, step: int) -> list[dict[str, torch.Tensor | None]]:
        """This rank's `gradient_accumulation_steps` micro-batches for optimizer step `step`."""
        mine = self.rank_rows(step)
        return [self.ds.batch(mine[m * self.micro_batch_size:(m + 1) * self.micro_batch_size].tolist())
                for m in range(self.gradient_accumulation_steps)]
