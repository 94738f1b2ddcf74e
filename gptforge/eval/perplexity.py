"""Loss, perplexity and bits per byte over a whole token sequence, every token counted once.

Windows of `block_size` tokens slide by `stride`; each window scores only the targets not scored
by an earlier window, so every target token (all but the first) is scored exactly once, with up to
block_size - stride tokens of context carried over (the sliding-window recipe of the Hugging Face
perplexity guide; stride = block_size gives disjoint windows).

With `document_mask_eos` (the EOS id of a run trained with train.document_mask), every window
is scored under the same block-diagonal mask and restarting positions as training
(`gptforge.model.gpt.document_mask`): no token sees another document.

bits per byte = total nats / ln 2 / UTF-8 bytes of the text (Gao et al. 2020, The Pile, sec. 5.1):
comparable across tokenizers, unlike per-token perplexity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gptforge.data.loader import TokenStream
from gptforge.model.gpt import GPT, document_mask
from gptforge.progress import progress as show_progress
from gptforge.runtime.device import autocast_context
from gptforge.runtime.loss import IGNORE_INDEX, token_loss_sum


@dataclass
class EvalResult:
    """Loss in nats per token, perplexity = exp(loss), bits per byte (None without a byte count)."""

    loss: float
    perplexity: float
    bits_per_byte: float | None
    tokens: int
    total_nats: float
    bytes: int | None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def sliding_windows(num_tokens: int, block_size: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, first_scored) per window over a sequence of `num_tokens` tokens.

    Inputs are tokens[begin:end] and targets tokens[begin+1:end+1] (target j is token j predicted
    from tokens < j); a window scores the targets j > first_scored. Together the windows score
    targets 1..num_tokens-1 exactly once.

    Raises:
        ValueError: stride not in [1, block_size], or fewer than 2 tokens.
    """
    if not 1 <= stride <= block_size:
        raise ValueError(f"stride must be in [1, block_size={block_size}], got {stride}")
    if num_tokens < 2:
        raise ValueError(f"need at least 2 tokens to score, got {num_tokens}")
    out, scored_upto, begin = [], 0, 0
    last = num_tokens - 1  # index of the last target
    while scored_upto < last:
        end = min(begin + block_size, last)
        out.append((begin, end, scored_upto))
        scored_upto = end
        begin += stride
    return out


@torch.no_grad()
def evaluate_tokens(model: GPT, tokens: np.ndarray | torch.Tensor, n_bytes: int | None = None,
                    stride: int | None = None, batch_size: int = 8, device: torch.device | str = "cpu",
                    autocast_dtype: torch.dtype | None = None, progress: bool = False,
                    document_mask_eos: int | None = None) -> EvalResult:
    """Score `tokens` (1-D int array, N) with `model`; see the module docstring.

    Args:
        n_bytes: UTF-8 bytes of the text these tokens encode, for bits per byte.
        stride: window shift in tokens (default block_size // 2).
        document_mask_eos: EOS id: attend within documents only (as train.document_mask trains).

    Returns: EvalResult over the N-1 target tokens.
    """
    device = torch.device(device)
    block = model.config.block_size
    stride = stride or max(1, block // 2)
    toks = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
    windows = sliding_windows(len(toks), block, stride)
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        with show_progress("perplexity", len(windows), "windows", enabled=progress) as bar:
            # Group windows of equal length so each batch is one tensor.
            i = 0
            while i < len(windows):
                length = windows[i][1] - windows[i][0]
                group = [windows[i]]
                while (i + len(group) < len(windows) and len(group) < batch_size
                       and windows[i + len(group)][1] - windows[i + len(group)][0] == length):
                    group.append(windows[i + len(group)])
                x = torch.stack([toks[b:e] for b, e, _ in group]).to(device)
                y = torch.stack([toks[b + 1 : e + 1] for b, e, _ in group]).clone()
                for r, (b, _e, first) in enumerate(group):
                    y[r, : first - b] = IGNORE_INDEX  # already scored by an earlier window
                y = y.to(device)
                ctx = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else torch.no_grad()
                with ctx:
                    logits = model(x, **_masking(x, document_mask_eos))
                total += float(token_loss_sum(logits, y))
                count += int((y != IGNORE_INDEX).sum())
                i += len(group)
                bar.advance(len(group))
    finally:
        model.train(was_training)
    loss = total / count
    bpb = total / math.log(2) / n_bytes if n_bytes else None
    return EvalResult(loss=loss, perplexity=math.exp(loss), bits_per_byte=bpb, tokens=count,
                      total_nats=total, bytes=n_bytes)


def _masking(x: torch.Tensor, eos_id: int | None) -> dict[str, torch.Tensor]:
    """The model keyword arguments of document masking for inputs x (B, T); {} without an EOS id."""
    if eos_id is None:
        return {}
    position_ids, attn_mask = document_mask(x, eos_id)
    return {"position_ids": position_ids, "attn_mask": attn_mask}


def unigram_entropy(tokens: np.ndarray, vocab_size: int, reference: np.ndarray | None = None) -> float:
    """Cross-entropy in nats/token of `tokens` under a unigram (token-frequency) model.

    The frequencies come from `reference` (e.g. the train split) with add-one smoothing, or from
    `tokens` themselves (then it is the empirical entropy). A language model that learned only
    token frequencies scores this; a useful model must be well below it.
    """
    src = np.asarray(reference if reference is not None else tokens)
    counts = np.bincount(src, minlength=vocab_size).astype(np.float64)
    if reference is not None:
        counts += 1.0
    p = counts / counts.sum()
    t = np.asarray(tokens)
    return float(-np.log(p[t]).mean())


@torch.no_grad()
def evaluate_windows(model: GPT, stream: TokenStream, offsets: np.ndarray, block_size: int,
                     batch_size: int, device: torch.device, precision: str, should_stop=None,
                     document_mask_eos: int | None = None) -> float | None:
    """Mean next-token loss (nats/token) over fixed windows, in eval mode.

    document_mask_eos: EOS id: attend within documents only (as train.document_mask trains).

    should_stop: checked between batches (e.g. a Ctrl-C during a long evaluation); when it
    returns True the evaluation ends early and returns None.
    """
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(offsets), batch_size):
        if should_stop is not None and should_stop():
            model.train(was_training)
            return None
        rows = np.stack([stream.read(int(o), block_size + 1) for o in offsets[i : i + batch_size]])
        t = torch.from_numpy(rows).to(device)
        with autocast_context(device, precision):
            x = t[:, :-1]
            logits = model(x, **_masking(x, document_mask_eos))
        total += float(token_loss_sum(logits, t[:, 1:]))
        count += t[:, 1:].numel()
    model.train(was_training)
    return total / count


def evaluate_mixture(model: GPT, folders: dict, split: str, n_windows: int, batch_size: int,
                     device: torch.device, precision: str, document_mask: bool = False) -> dict:
    """Per-source loss and bits per byte of a mixture's `split`, on the windows training scores.

    Each source's split is scored on `gptforge.data.loader.eval_windows(stream, block_size,
    n_windows)` (each once when it holds fewer) with `evaluate_windows`, as a training run's
    validation does. Bits per byte of a source: loss / ln 2 x tokens / UTF-8 bytes of its split.
    Overall: the token-weighted mean over the sources' splits, sum_i T_i L_i / sum_i T_i.

    Args:
        folders: source name -> shard folder. n_windows: windows per source (train.eval_steps x
            micro_batch_size). document_mask: score under the run's document mask.

    Returns: {"sources": {name: {"loss", "bits_per_byte", "tokens", "windows", "windows_asked"}},
    "loss": overall, "tokens": all the split's tokens}.

    Raises:
        ValueError: a source's split holds less than one window (naming the folder).
    """
    from gptforge.data.loader import eval_windows
    from gptforge.data.shards import load_meta

    block = model.config.block_size
    out, num, den = {}, 0.0, 0
    for name, folder in folders.items():
        meta = load_meta(folder)
        sp = meta["splits"].get(split) or {}
        if not sp.get("tokens"):
            continue
        stream = TokenStream([Path(folder) / f for f in sp["files"]], meta["dtype"])
        try:
            offsets = eval_windows(stream, block, n_windows)
        except ValueError as e:
            raise ValueError(f"{folder}: {e}") from None
        eos = int(meta["eos_id"]) if document_mask else None
        loss = evaluate_windows(model, stream, offsets, block, batch_size, device, precision, document_mask_eos=eos)
        stream.close()
        n_tok, n_bytes = int(sp["tokens"]), int(sp.get("bytes") or 0)
        out[name] = {"loss": loss, "bits_per_byte": loss / math.log(2) * n_tok / n_bytes if n_bytes else None,
                     "tokens": n_tok, "windows": len(offsets), "windows_asked": n_windows}
        num, den = num + n_tok * loss, den + n_tok
    return {"sources": out, "loss": num / den if den else None, "tokens": den}
