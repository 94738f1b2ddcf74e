"""Where the trainer's batches come from: one `BatchSource` protocol (base), one module per kind.

- base: the `BatchSource` / `Batches` protocols, every member the trainer reads, and `SourceBase` /
  `BatchesBase` with the optional members' defaults; `ModelHandle`, what `bind` gives a source.
- shards: `ShardSource`, token shards from `gptforge prepare` (pretraining, continued pretraining).
- mixture: `MixtureSource`, several shard sources mixed by train.data_weights / train.stages.
- instruction: `InstructionData`, instruction .jsonl with completion-only targets (`gptforge finetune`).
- fixed: `FixedBatchSource`, one fixed batch at every step (the overfit sanity check).

A new kind of data is a new module here with a class deriving from `SourceBase` (docs/extending.md).
"""

from gptforge.train.sources.base import Batches, BatchesBase, BatchSource, ModelHandle, SourceBase
from gptforge.train.sources.fixed import FixedBatchSource
from gptforge.train.sources.instruction import InstructionData
from gptforge.train.sources.mixture import MixtureSource, open_source, parse_data_weights
from gptforge.train.sources.shards import ShardBatches, ShardSource, with_document_mask

__all__ = ["BatchSource", "Batches", "BatchesBase", "FixedBatchSource", "InstructionData", "ModelHandle",
           "MixtureSource", "ShardBatches", "ShardSource", "SourceBase", "open_source", "parse_data_weights",
           "with_document_mask"]
