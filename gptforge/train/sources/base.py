"""The `BatchSource` protocol: every member the trainer reads, the optional ones defaulted in `SourceBase`.

The trainer (gptforge.train.trainer) and the resolver (gptforge.train.resolve) never ask which
kind of source they were given: no `isinstance`, `hasattr` or `getattr` on a source or its
batches (tests/train/test_trainer_contracts.py). What a source does not need, it inherits from
`SourceBase` / `BatchesBase`, whose defaults say "nothing of that kind here".

Order of the calls the trainer makes on a source: `vocab_size`, `description`, `source_tokens`,
`provenance()` and `check_resume()` while the run is resolved; `check_window(block_size)` before
the model is built; `bind(handle)` once the model is laid out; `batches(...)` once; then per
optimizer step `micro_batches(step)` and `step_metrics(step)` of the batches; `evaluate(...)` and
`val_metrics()` at each evaluation (`pipeline_val()` under pipeline parallelism);
`state_dict()`/`load_state_dict()` through the checkpoint; `close()` at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

import torch

if TYPE_CHECKING:
    import numpy as np

    from gptforge.data.loader import TokenStream
    from gptforge.train.parallel.distributed import DistEnv


class Batches(Protocol):
    """The batches of a run on one data-parallel rank."""

    global_batch_size: int
    """Sequences per optimizer step over all dp ranks (rows of a pair count once each)."""
    tokens_per_step: int
    """Tokens per optimizer step over all dp ranks (padding included): the tokens/s figure."""
    seq_len: int
    """Tokens per sequence (the FLOPs per token figure)."""

    def micro_batches(self, step: int) -> list:
        """This rank's `gradient_accumulation_steps` micro-batches of optimizer step `step`: what the
        run's objective reads (gptforge.train.objectives). For token objectives, (inputs (b, T),
        targets (b, T)) int64 pairs or dicts (see `gptforge.runtime.loss.unpack_micro_batch`); any
        tensors in a tuple or a dict's values are moved to the device before the objective sees them."""
        ...

    def step_metrics(self, step: int) -> dict[str, Any]:
        """Fields the trainer adds to step `step`'s metrics row ({} for none)."""
        ...


class BatchesBase:
    """Defaults of the optional `Batches` members (no per-step fields)."""

    global_batch_size: int
    tokens_per_step: int
    seq_len: int

    def step_metrics(self, step: int) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class ModelHandle:
    """The laid-out policy, as a source that makes its batches with the model sees it (RL rollouts
    sampled from the current weights).

    Attributes:
        core: the model whose parameters train (the GPT itself, FSDP2-sharded in place under
            FSDP; a pipeline stage's part under pipeline parallelism).
        module: what a forward goes through (DDP wrapper, or `core`); None on a pipeline rank.
        device: this rank's device. precision: the run's autocast precision (fp32, bf16, fp16).
        env: where this process sits (dp rank and size, process groups).
    """

    core: torch.nn.Module
    module: torch.nn.Module | None
    device: torch.device
    precision: str
    env: DistEnv


class BatchSource(Protocol):
    """What the trainer reads data through (see the module docstring for the order of calls)."""

    vocab_size: int
    """Token ids run below this."""
    description: str
    """One log line: what the data is."""
    has_val: bool
    """Whether `evaluate` gives a loss (valid after `batches` was called)."""
    tokenizer_file: Path | None
    """tokenizer.json to copy into the run directory, or None."""
    source_tokens: dict[str, int] | None
    """A mixture's sources: name -> train tokens (the default data weights, the `val/NAME/loss`
    names train.best_metric may take); None for data of one source."""
    val_metric_names: tuple[str, ...]
    """Names of the metrics `val_metrics` gives that train.best_metric may take, higher being
    better (an RL run's eval/pass@1); () for none."""
    data_dir: Path | None
    """The shard folder the run report reads its data figures from, or None."""
    supports_pipeline: bool
    """Whether the source runs under pipeline parallelism (it then gives `pipeline_val`)."""

    def check_window(self, block_size: int) -> None:
        """Refuse, before the model is allocated, a window the data cannot fill (InputError)."""
        ...

    def bind(self, model: ModelHandle) -> None:
        """Called once the model is laid out, before `batches`: a source whose batches come from
        the model (RL rollouts) keeps the handle; others ignore it."""
        ...

    def extra_memory_bytes(self) -> int:
        """Bytes this source holds on the model's device beside a training step (after `bind`):
        an RL source's sampling KV cache; the trainer adds them to the planner's prediction."""
        ...

    def batches(self, block_size: int, tc, dp_rank: int, dp_size: int) -> Batches: ...

    def evaluate(self, model: torch.nn.Module, device: torch.device, precision: str,
                 should_stop: Callable[[], bool] | None = None) -> float | None:
        """Mean validation loss in nats per counted unit (None without a val set, or when
        `should_stop()` turned True between batches)."""
        ...

    def val_metrics(self) -> dict[str, float]:
        """Fields the trainer adds to the row of each evaluation ({} for none)."""
        ...

    def pipeline_val(self) -> tuple[TokenStream, np.ndarray] | None:
        """The validation token stream and window offsets that pipeline evaluation scores (None
        without a val split)."""
        ...

    def provenance(self) -> dict[str, Any]:
        """config.yaml's `data` section (path and hashes)."""
        ...

    def check_resume(self, saved: dict[str, Any], checkpoint: Path) -> None:
        """Raise InputError when the run saved in `saved` (its config.yaml) used other data."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """State a checkpoint carries (plain data; {} for none)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class SourceBase:
    """Defaults of the optional `BatchSource` members: one source, no model needed, no pipeline,
    no extra metrics, no state, nothing to close. A source sets the required attributes
    (vocab_size, description, has_val, tokenizer_file) and defines `batches`, `evaluate`,
    `provenance` and `check_resume`."""

    source_tokens: dict[str, int] | None = None
    val_metric_names: tuple[str, ...] = ()
    data_dir: Path | None = None
    supports_pipeline: bool = False

    def check_window(self, block_size: int) -> None:
        return None

    def bind(self, model: ModelHandle) -> None:
        return None

    def extra_memory_bytes(self) -> int:
        return 0

    def val_metrics(self) -> dict[str, float]:
        return {}

    def pipeline_val(self) -> tuple[TokenStream, np.ndarray] | None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None

    def close(self) -> None:
        return None
