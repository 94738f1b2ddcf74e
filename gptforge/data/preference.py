"""Preference pairs: a .jsonl of (prompt, chosen, rejected) rows -> token ids -> padded pair batches.

Row formats (TRL's, one JSON object per line):
- plain: `{"prompt": "2+2=", "chosen": " 4", "rejected": " 5"}`;
- conversational: the same keys holding message lists, `prompt` the turns before the answer and
  `chosen` / `rejected` the answer turns (each ending with an assistant message);
- implicit prompt: only `chosen` and `rejected`, two full texts or conversations; the prompt is
  their common start (whole messages for conversations; characters for text, moved back before a
  space as TRL's `extract_prompt` does).

Tokenisation follows TRL 1.16's `DPOTrainer`: the prompt alone and prompt+completion are tokenised
separately (text: prompt + completion + EOS, EOS appended to non-conversational completions;
conversations: the chat template, the prompt with the generation prompt) and the completion is what
follows their common prefix, so BPE merges across the boundary come out as TRL's. Text from the
data is encoded with special-token matching off (a literal "<|im_end|>" is plain text), as
`gptforge.data.chat` does for instruction data.

Length: `block_size` bounds prompt+completion (TRL's `max_length` counts the same tokens). TRL
truncates longer rows; here a row whose chosen or rejected sequence is longer is dropped and
counted (a warning names each by file:line), so no pair trains on a cut answer.

Batches (`PairDataset.batch`, TRL's `DataCollatorForPreference` layout): the b chosen rows, then
the b rejected rows of the same pairs in the same order, right-padded to the longest:
  input_ids (2b, T) int64    the sequence without its last token
  labels    (2b, T) int64    the next token where it is a completion token, else -100
  targets   (2b, T) int64    the next token wherever there is one (prompt too), else -100
with T = longest sequence - 1. Right padding needs no attention mask under a causal model.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gptforge.data.chat import (
    DEFAULT_TEMPLATE,
    ROLE_HEADERS,
    ChatTokenizer,
    render_chat_template,
    render_default,
)
from gptforge.data.instruct import EpochOrder
from gptforge.errors import InputError
from gptforge.runtime.loss import IGNORE_INDEX

# ---------------------------------------------------------------------------------------------
# One row


@dataclass
class PairExample:
    """One tokenised pair: prompt_ids, chosen_ids, rejected_ids (completions after the prompt)."""

    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    where: str = ""


def _is_messages(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) for m in value)


def extract_prompt(chosen, rejected):
    """(prompt, chosen rest, rejected rest) of an implicit-prompt pair, as TRL's `extract_prompt`:
    the longest common prefix (messages or characters); for text, a space just before the point
    where they differ goes with the completions."""
    idx = 0
    for idx in range(min(len(chosen), len(rejected))):
        if chosen[idx] != rejected[idx]:
            if chosen[idx - 1] == " ":
                idx -= 1
            break
    return chosen[:idx], chosen[idx:], rejected[idx:]


def _check_turns(messages, where: str, key: str, answer: bool) -> None:
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLE_HEADERS or not isinstance(m.get("content"), str):
            raise InputError(f"{where}: {key}[{j}] must have role system/user/assistant and string content, "
                             f"got {m!r:.80}")
    if answer and messages[-1]["role"] != "assistant":
        raise InputError(f"{where}: `{key}` must end with an assistant message (the answer), it ends with "
                         f"{messages[-1]['role']!r}")
    if answer and not messages[-1]["content"].strip():
        raise InputError(f"{where}: `{key}` ends with an empty assistant message; give a non-empty answer")


def normalize_row(row, where: str) -> tuple[Any, Any, Any, bool]:
    """(prompt, chosen, rejected, conversational) of one row in any of the three formats.

    Raises:
        InputError: a row in none of the formats, chosen == rejected, an empty completion, a
            message list not ending with an assistant turn (the message names where and the field).
    """
    if not isinstance(row, dict):
        raise InputError(f"{where}: expected a JSON object with prompt/chosen/rejected, got {type(row).__name__}")
    missing = [k for k in ("chosen", "rejected") if k not in row]
    if missing:
        raise InputError(f"{where}: a preference row needs `chosen` and `rejected` (and `prompt` unless both are "
                         f"full conversations); `{missing[0]}` is missing (keys: {sorted(row)})")
    chosen, rejected = row["chosen"], row["rejected"]
    conversational = _is_messages(chosen)
    for key in ("chosen", "rejected"):
        value = row[key]
        if not (isinstance(value, str) or _is_messages(value)) or _is_messages(value) != conversational:
            raise InputError(f"{where}: `{key}` must be a string or a list of messages like `chosen`, "
                             f"got {type(value).__name__}")
    if chosen == rejected:
        raise InputError(f"{where}: `chosen` and `rejected` are the same; a pair needs two different answers")
    if "prompt" in row:
        prompt = row["prompt"]
        if conversational != _is_messages(prompt) or not (isinstance(prompt, str) or _is_messages(prompt)):
            kind = "a list of messages" if conversational else "a string"
            raise InputError(f"{where}: `prompt` must be {kind}, like `chosen` and `rejected`")
    else:
        prompt, chosen, rejected = extract_prompt(chosen, rejected)
    for key, value in (("chosen", chosen), ("rejected", rejected)):
        if not value or (isinstance(value, str) and not value.strip()):
            raise InputError(f"{where}: `{key}` is an empty completion; give a non-empty answer")
    if conversational:
        if prompt:
            _check_turns(prompt, where, "prompt", answer=False)
        _check_turns(chosen, where, "chosen", answer=True)
        _check_turns(rejected, where, "rejected", answer=True)
    return prompt, chosen, rejected, conversational


def _common_prefix_length(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _encode_text_with_eos(tok: ChatTokenizer, text: str) -> list[int]:
    """[BOS] text EOS as TRL makes a non-conversational sequence (EOS appended unless present)."""
    head = [tok.bos_id] if tok.add_bos else []
    if text.endswith(tok.eos_token):
        text = text[: -len(tok.eos_token)]
    return head + tok.encode_text(text) + [tok.eos_id]


def tokenize_pair(tok: ChatTokenizer, row, where: str = "row", template: str | None = None) -> PairExample:
    """Tokenise one row as TRL's DPOTrainer does (see the module docstring).

    template: None uses the tokenizer's chat template when it has one, else gptforge's default
    (`gptforge.data.chat`); `DEFAULT_TEMPLATE` forces the default.

    Raises:
        InputError: see `normalize_row`; a completion that tokenises to nothing.
    """
    prompt, chosen, rejected, conversational = normalize_row(row, where)
    if conversational:
        use_jinja = bool(tok.chat_template) and template != DEFAULT_TEMPLATE

        def render(messages, gen: bool) -> list[int]:
            if use_jinja:
                return render_chat_template(tok, messages, add_generation_prompt=gen, where=where).ids
            return render_default(tok, messages, add_generation_prompt=gen).ids

        prompt_ids = render(prompt, True) if prompt else []
        full_chosen, full_rejected = render(prompt + chosen, False), render(prompt + rejected, False)
    else:
        prompt_ids = ([tok.bos_id] if tok.add_bos else []) + tok.encode_text(prompt)
        full_chosen = _encode_text_with_eos(tok, prompt + chosen)
        full_rejected = _encode_text_with_eos(tok, prompt + rejected)
    n = min(_common_prefix_length(prompt_ids, full_chosen), _common_prefix_length(prompt_ids, full_rejected))
    example = PairExample(prompt_ids[:n], full_chosen[n:], full_rejected[n:], where)
    for key in ("chosen", "rejected"):
        if not getattr(example, f"{key}_ids"):
            raise InputError(f"{where}: `{key}` adds no token after the prompt; give a non-empty answer")
    return example


# ---------------------------------------------------------------------------------------------
# A file


def load_pairs(path: str | Path, tok: ChatTokenizer, block_size: int, template: str | None = None,
               ) -> tuple[list[PairExample], dict]:
    """Tokenise every row of a preference .jsonl; drop (and count) rows longer than block_size.

    Returns (examples, stats) with stats = {rows, dropped_too_long, chosen_tokens, rejected_tokens}
    (completion tokens of the kept pairs). A warning names the first dropped rows by file:line.

    Raises:
        MissingInputError: no file. InputError: a line that is not JSON, a bad row (file:line and
            field, see `normalize_row`), or no row that fits block_size.
    """
    from gptforge.data.instruct import read_jsonl
    from gptforge.errors import MissingInputError

    path = Path(path)
    if not path.is_file():
        raise MissingInputError(f"{path}: no such preference file (.jsonl with prompt/chosen/rejected rows)")
    examples: list[PairExample] = []
    too_long: list[str] = []
    rows = 0
    try:
        for where, row in read_jsonl(path):
            rows += 1
            ex = tokenize_pair(tok, row, where, template)
            longest = len(ex.prompt_ids) + max(len(ex.chosen_ids), len(ex.rejected_ids))
            if longest > block_size:
                too_long.append(f"{where}: prompt+completion is {longest} tokens, over block_size {block_size}")
                continue
            examples.append(ex)
    except ValueError as e:
        raise InputError(str(e)) from None
    if not examples:
        raise InputError(f"{path}: no pair fits finetune.block_size {block_size} ({len(too_long)} of {rows} rows "
                         "longer); raise --finetune.block_size or shorten the rows")
    if too_long:
        shown = "\n  ".join(too_long[:5]) + (f"\n  ... and {len(too_long) - 5} more" if len(too_long) > 5 else "")
        warnings.warn(f"{path}: dropped {len(too_long)} of {rows} pair(s) longer than block_size {block_size}:"
                      f"\n  {shown}", stacklevel=2)
    stats = {"rows": rows, "dropped_too_long": len(too_long),
             "chosen_tokens": sum(len(e.chosen_ids) for e in examples),
             "rejected_tokens": sum(len(e.rejected_ids) for e in examples)}
    return examples, stats


# ---------------------------------------------------------------------------------------------
# Batches


@dataclass
class PairDataset:
    """Tokenised pairs arranged as TRL's collator does (module docstring: shapes).

    `batch(indices)` gives b pairs as 2b rows; `ref_logps` (N, 2) float64, when set (precomputed
    reference log-probs, chosen then rejected), rides along as `ref_chosen_logps` /
    `ref_rejected_logps` (b,) of the batch, and `index` (b,) names the pairs.
    """

    examples: list[PairExample]
    pad_id: int = 0
    stats: dict = field(default_factory=dict)
    ref_logps: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.examples)

    def batch(self, indices) -> dict[str, torch.Tensor]:
        """The pairs `indices` as one batch: input_ids / labels / targets (2b, T), index (b,)."""
        indices = [int(i) for i in indices]
        seqs = [(self.examples[i].prompt_ids, self.examples[i].chosen_ids) for i in indices]
        seqs += [(self.examples[i].prompt_ids, self.examples[i].rejected_ids) for i in indices]
        T = max(len(p) + len(c) for p, c in seqs) - 1
        input_ids = np.full((len(seqs), T), self.pad_id, dtype=np.int64)
        labels = np.full((len(seqs), T), IGNORE_INDEX, dtype=np.int64)
        targets = np.full((len(seqs), T), IGNORE_INDEX, dtype=np.int64)
        for r, (p, c) in enumerate(seqs):
            ids = np.asarray(p + c, dtype=np.int64)
            n = len(ids) - 1
            input_ids[r, :n] = ids[:-1]
            targets[r, :n] = ids[1:]
            start = max(len(p) - 1, 0)  # position that predicts the first completion token
            labels[r, start:n] = ids[start + 1:]
        out = {"input_ids": torch.from_numpy(input_ids), "labels": torch.from_numpy(labels),
               "targets": torch.from_numpy(targets), "index": torch.tensor(indices, dtype=torch.int64)}
        if self.ref_logps is not None:
            ref = torch.from_numpy(self.ref_logps[indices])
            out["ref_chosen_logps"], out["ref_rejected_logps"] = ref[:, 0], ref[:, 1]
        return out


def pairs_from_jsonl(path: str | Path, tok: ChatTokenizer, block_size: int,
                     template: str | None = None) -> PairDataset:
    """`load_pairs` as a PairDataset padded with the tokenizer's EOS id."""
    examples, stats = load_pairs(path, tok, block_size, template)
    return PairDataset(examples, pad_id=tok.eos_id, stats=stats)


def describe(stats: dict, path: str | Path) -> str:
    """One line about a loaded preference file (for the run's log)."""
    return (f"{Path(path).name}: {stats['rows'] - stats['dropped_too_long']:,} pairs "
            f"({stats['chosen_tokens']:,} chosen / {stats['rejected_tokens']:,} rejected completion tokens; "
            f"{stats['dropped_too_long']} longer than block_size dropped)")



class PairBatches(EpochOrder):
    """Micro-batches of pairs for the training loop, deterministic in (seed, step, index).

    Global batch entry i of optimizer step `step` is pair perm_e[g mod N] with g = step*G + i,
    e = g // N (the epoch) and perm_e a Philox permutation keyed on (seed, e), as
    `gptforge.data.instruct.InstructionBatches` draws rows: every pair once per epoch, a resumed
    run reads what the uninterrupted one would have, and the global batch of G pairs is the same
    whatever micro_batch_size x gradient_accumulation_steps x dp_size. A pair is one entry, so its
    chosen and rejected rows are always in the same micro-batch on the same rank. `micro_batch_size`
    counts pairs (TRL's per_device_train_batch_size); each micro-batch has 2 * micro_batch_size rows.
    """

    def __init__(self, ds: PairDataset, micro_batch_size: int, gradient_accumulation_steps: int, seed: int,
                 dp_rank: int = 0, dp_size: int = 1):
        super().__init__(len(ds), micro_batch_size, gradient_accumulation_steps, seed, dp_rank, dp_size,
                         empty="preference dataset has no pairs")
        self.ds = ds

    def pairs(self, step: int) -> np.ndarray:
        """Pair indices of the whole global batch of `step`: int64 (global_batch_size,)."""
        return self.rows(step)

    def micro_batches(self, step: int) -> list[dict[str, torch.Tensor]]:
        """This rank's `gradient_accumulation_steps` pair batches for optimizer step `step`."""
        mine = self.rank_rows(step)
        b = self.micro_batch_size
        return [self.ds.batch(mine[m * b:(m + 1) * b].tolist()) for m in range(self.gradient_accumulation_steps)]
