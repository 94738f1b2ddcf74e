"""Instruction .jsonl as a `BatchSource` (gptforge.train.sources.base): completion-only targets
(prompt tokens are -100, so the next-token objective counts only the completion), packed or
padded rows, a held-out val split (`gptforge finetune`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gptforge.config import FinetuneConfig
from gptforge.errors import InputError
from gptforge.runtime.loss import IGNORE_INDEX
from gptforge.train.provenance import data_provenance
from gptforge.train.sources.base import SourceBase
from gptforge.train.sources.shards import ShardBatches


class InstructionData(SourceBase):
    """Instruction .jsonl as a loop data source: completion-only loss, val split held out.

    Examples are split train/val by a permutation keyed on `seed` (fixed for a run, so resume sees
    the same split); val loss = summed completion-token loss / completion tokens (nats/token).

    Raises:
        FileNotFoundError, ValueError: see `InstructionDataset.from_jsonl`; a tokenizer larger
            than the model's vocabulary.
    """

    def __init__(self, path: Path, tokenizer, seq_len: int, fc: FinetuneConfig, seed: int):
        from gptforge.data.chat import DEFAULT_TEMPLATE
        from gptforge.data.instruct import InstructionDataset, load_examples

        self.path, self.seq_len = Path(path), seq_len
        template = DEFAULT_TEMPLATE if fc.chat_template == "default" else None
        examples = load_examples(self.path, tokenizer, template, cache=fc.cache)
        n_val = int(len(examples) * fc.val_fraction) if fc.val_fraction > 0 else 0
        n_val = min(n_val, len(examples) - 1)
        order = np.random.Generator(np.random.Philox(key=[seed & (2**64 - 1), 0x5EED])).permutation(len(examples))
        val_idx, train_idx = set(order[:n_val].tolist()), order[n_val:]
        train_ex = [examples[i] for i in sorted(train_idx.tolist())]
        val_ex = [examples[i] for i in sorted(val_idx)]
        self.train = InstructionDataset.from_examples(train_ex, seq_len, fc.packing, pad_id=tokenizer.eos_id)
        if not self.train.sequences:
            raise ValueError(f"{path}: no example with a completion token within finetune.block_size {seq_len}")
        self.val = InstructionDataset.from_examples(val_ex, seq_len, fc.packing, pad_id=tokenizer.eos_id) \
            if val_ex else None
        if self.val is not None and not self.val.sequences:
            self.val = None
        self.has_val = self.val is not None
        self.tokenizer_file: Path | None = None  # the run directory already holds the model's tokenizer
        self.vocab_size = tokenizer.tokenizer.get_vocab_size(with_added_tokens=True)
        st = self.train.stats
        self.description = (
            f"{path.name}: {st['examples']:,} training examples ({st['target_tokens']:,} completion tokens, "
            f"{st['truncated']} truncated, {st['dropped_no_target']} without a completion token left) in "
            f"{len(self.train):,} {fc.packing} rows of {seq_len}"
            + (f"; {len(val_ex)} held out for validation" if self.has_val else "")
        )

    def batches(self, block_size: int, tc, dp_rank: int, dp_size: int) -> ShardBatches:
        from gptforge.data.instruct import InstructionBatches

        return ShardBatches(InstructionBatches(self.train, tc.micro_batch_size, tc.gradient_accumulation_steps, tc.seed,
                                           dp_rank=dp_rank, dp_size=dp_size), self.seq_len)

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, device: torch.device, precision: str,
                 should_stop=None) -> float | None:
        from gptforge.runtime.device import autocast_context
        from gptforge.runtime.loss import token_loss_sum, unpack_micro_batch

        if self.val is None:
            return None
        was = model.training
        model.eval()
        total, count = 0.0, 0
        rows = list(range(len(self.val)))
        for i in range(0, len(rows), 8):
            if should_stop is not None and should_stop():
                model.train(was)
                return None
            x, y, extra = unpack_micro_batch(self.val.batch(rows[i:i + 8]))
            with autocast_context(device, precision):
                logits = model(x.to(device), **{k: v.to(device) for k, v in extra.items()})
            total += float(token_loss_sum(logits, y.to(device)))
            count += int((y != IGNORE_INDEX).sum())
        model.train(was)
        return total / max(count, 1)

    def provenance(self) -> dict:
        return data_provenance(self.path)

    def check_resume(self, saved: dict, checkpoint: Path) -> None:
        """Raise InputError when the run (its config.yaml `data.sha256`) was trained on another
        instruction file than `self.path` (sha256 of the file's bytes). The tokenizer needs no
        check: it is the run's own (RUN_DIR/tokenizer.json)."""
        saved_sha = (saved.get("data") or {}).get("sha256")
        new_sha = self.provenance().get("sha256")
        if saved_sha and saved_sha != new_sha:
            raise InputError(
                f"--resume: {self.path} (sha256 {str(new_sha)[:12]}) is not the instruction data the run "
                f"was trained on (sha256 {saved_sha[:12]} in {checkpoint / 'config.yaml'}, "
                f"{(saved.get('data') or {}).get('path')}); resume with that data, or start a new run with --out"
            )

    def close(self) -> None:
        pass
