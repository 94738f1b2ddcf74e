"""Preference pairs as a `BatchSource` (gptforge.train.sources.base): TRL-format pair rows
(`gptforge.data.preference`), a held-out validation split, micro-batches of whole pairs
(`PairBatches`: a pair's chosen and rejected rows in one micro-batch on one rank), and validation
by the preference objective itself (its loss per pair, and TRL's reward metrics as val/rewards/...).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gptforge.config import FinetuneConfig
from gptforge.data.preference import PairBatches, PairDataset, describe, load_pairs
from gptforge.train.objectives.preference import Preference, split_pairs
from gptforge.train.provenance import data_provenance
from gptforge.train.sources.base import BatchesBase, SourceBase


class PairStepBatches(BatchesBase):
    """`PairBatches` with the figures the trainer logs: global_batch_size counts rows (2 per
    pair), tokens_per_step rows x seq_len (padding included, an upper bound of what runs)."""

    def __init__(self, inner: PairBatches, seq_len: int):
        self.inner, self.seq_len = inner, seq_len
        self.global_batch_size = 2 * inner.global_batch_size
        self.tokens_per_step = self.global_batch_size * seq_len

    def micro_batches(self, step: int) -> list:
        return self.inner.micro_batches(step)


class PairSource(SourceBase):
    """A preference .jsonl for `gptforge finetune --finetune.objective dpo`.

    `seq_len` (finetune.block_size) bounds prompt+completion, as TRL's max_length; longer pairs are
    dropped and counted. `finetune.val_fraction` of the pairs is held out (Philox split keyed on the
    seed, fixed for a run); `evaluate` returns the objective's mean loss per validation pair.

    Raises:
        InputError: see `gptforge.data.preference.load_pairs`.
    """

    def __init__(self, path: Path, tokenizer, seq_len: int, fc: FinetuneConfig, seed: int, objective: Preference):
        from gptforge.data.chat import DEFAULT_TEMPLATE

        self.path, self.seq_len, self.objective = Path(path), seq_len, objective
        template = DEFAULT_TEMPLATE if fc.chat_template == "default" else None
        examples, stats = load_pairs(self.path, tokenizer, seq_len, template)
        train_idx, val_idx = split_pairs(len(examples), fc.val_fraction, seed)
        self.train = PairDataset([examples[i] for i in train_idx], tokenizer.eos_id, stats)
        self.val = PairDataset([examples[i] for i in val_idx], tokenizer.eos_id) if val_idx else None
        self.has_val = self.val is not None
        self.tokenizer_file: Path | None = None  # the run directory already holds the model's tokenizer
        self.vocab_size = tokenizer.tokenizer.get_vocab_size(with_added_tokens=True)
        self.description = describe(stats, self.path) + (f"; {len(val_idx)} held out for validation"
                                                         if val_idx else "")
        self._val_metrics: dict[str, float] = {}

    def datasets(self) -> dict[str, PairDataset]:
        """The pair sets a precomputed reference covers."""
        return {"train": self.train, **({"val": self.val} if self.val is not None else {})}

    def batches(self, block_size: int, tc, dp_rank: int, dp_size: int) -> PairStepBatches:
        return PairStepBatches(PairBatches(self.train, tc.micro_batch_size, tc.gradient_accumulation_steps, tc.seed,
                                           dp_rank=dp_rank, dp_size=dp_size), self.seq_len)

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, device: torch.device, precision: str,
                 should_stop=None) -> float | None:
        from gptforge.runtime.device import autocast_context

        if self.val is None:
            return None
        was = model.training
        model.eval()
        total, sums, n = 0.0, dict.fromkeys(self.objective.metric_names, 0.0), 0
        try:
            for start in range(0, len(self.val), 8):
                if should_stop is not None and should_stop():
                    return None
                batch = {k: v.to(device) for k, v in self.val.batch(range(start, min(start + 8, len(self.val)))).items()}

                def autocast():
                    return autocast_context(device, precision)

                with autocast():
                    logits = model(batch["input_ids"])
                loss, metrics = self.objective.pair_loss(logits, batch, "val", autocast)
                total += float(loss)
                n += int(batch["index"].numel())
                for k, v in metrics.items():
                    sums[k] += float(v.sum())
        finally:
            model.train(was)
        self._val_metrics = {f"val/{k}": v / n for k, v in sums.items()}
        return total / max(n, 1)

    def val_metrics(self) -> dict[str, float]:
        return dict(self._val_metrics)

    def provenance(self) -> dict[str, Any]:
        return data_provenance(self.path)

    def check_resume(self, saved: dict[str, Any], checkpoint: Path) -> None:
        """Nothing to compare: the tokenizer is the run's own (RUN_DIR/tokenizer.json)."""
