"""One fixed batch at every step (the overfit sanity check, gptforge.train.workflows.sanity)."""

from __future__ import annotations

from pathlib import Path

from gptforge.train.sources.base import BatchesBase, BatchSource, ModelHandle, SourceBase


class FixedBatches(BatchesBase):
    """Step 0's micro-batches of `inner` at every step."""

    def __init__(self, inner):
        self.inner = inner
        self.seq_len, self.global_batch_size = inner.seq_len, inner.global_batch_size
        self.tokens_per_step = inner.tokens_per_step
        self.fixed = inner.micro_batches(0)

    def micro_batches(self, step: int):
        return self.fixed


class FixedBatchSource(SourceBase):
    """A BatchSource that trains on one fixed batch of `source` and has no validation set."""

    def __init__(self, source: BatchSource):
        self.source = source
        self.vocab_size, self.tokenizer_file = source.vocab_size, source.tokenizer_file
        self.description = f"one fixed batch of {source.description} (sanity check)"
        self.has_val = False
        self.last_batches: FixedBatches | None = None

    def check_window(self, block_size: int) -> None:
        self.source.check_window(block_size)

    def bind(self, model: ModelHandle) -> None:
        self.source.bind(model)

    def batches(self, block_size: int, tc, dp_rank: int, dp_size: int):
        self.last_batches = FixedBatches(self.source.batches(block_size, tc, dp_rank, dp_size))
        return self.last_batches

    def evaluate(self, model, device, precision, should_stop=None):
        return None

    def provenance(self) -> dict:
        return {**self.source.provenance(), "sanity_overfit": True}

    def check_resume(self, saved: dict, checkpoint: Path) -> None:
        self.source.check_resume(saved, checkpoint)

    def close(self) -> None:
        self.source.close()
