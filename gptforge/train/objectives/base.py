"""The `Objective` protocol: what one training step minimises, and everything the trainer asks of it.

Per optimizer step the trainer (gptforge.train.trainer) and the step function (gptforge.train.step):
1. count, before any forward, the units of every micro-batch (`count`: target tokens, sequences
   or pairs, as `unit` says) and all-reduce the sum over the ranks;
2. call `loss(forward, micro_batch)` per micro-batch: its `loss` is summed over the units of that
   micro-batch (not averaged), and is divided by the step's global count before backward, so the
   update equals one big batch's mean per unit however units fall across micro-batches and ranks;
3. log the step's loss (sum over ranks / count) and each metric as sum over ranks / weight over
   ranks (`ObjectiveLoss.metrics`, names declared up front in `metric_names`).

Set-up and state: `setup(layout)` runs once the policy is laid out (place a frozen reference
model like the policy with `layout.place`, read precomputed reference log-probs from
`layout.run_dir`); `state_dict()` / `load_state_dict()` ride in every checkpoint under
trainer_state.pt's `objective` key (gptforge.train.state), for --resume and a spike rollback.

Pipeline parallelism: the last stage sees only (logits, targets), so an objective runs under
parallel.pp > 1 when its loss is a function of those alone (`supports_pipeline`, then
`pipeline_loss`); the trainer refuses the others with an InputError naming the objective.

Implementations: gptforge.train.objectives.next_token.NextToken (pretraining and completion-only
SFT: the instruction source masks prompt targets), gptforge.train.objectives.distill.Distillation.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, Protocol

import torch

from gptforge.config import ModelConfig, ParallelConfig, TrainConfig
from gptforge.runtime.device import autocast_context

if TYPE_CHECKING:
    from gptforge.train.sources.base import ModelHandle

Unit = Literal["tokens", "sequences", "pairs"]
"""What an objective's loss is normalised by (summed over, then divided by the step's count)."""


@dataclass
class ObjectiveLoss:
    """One micro-batch's result.

    Attributes:
        loss: 0-dim tensor with grad: the loss summed over the micro-batch's units (nats for a
            log-likelihood loss), what backward runs on after the trainer's division.
        metrics: name -> (sum, weight): the trainer logs sum over micro-batches and ranks divided
            by weight over micro-batches and ranks (e.g. summed KL over tokens with weight the
            token count; the share of pairs ranked right with weight the pair count). Tensors are
            detached by the trainer; names must be among the objective's `metric_names`.
    """

    loss: torch.Tensor
    metrics: dict[str, tuple[torch.Tensor | float, torch.Tensor | float]] = field(default_factory=dict)


class Forward:
    """The policy's forward for an objective: `forward(inputs, **extra)` runs the laid-out model
    on inputs (B, T) int64 under the run's autocast and returns logits (B, T, V).

    Attributes:
        model: the module a forward goes through (the DDP wrapper, or the model itself).
        device, precision: this rank's device and the run's autocast precision.
    """

    def __init__(self, model: torch.nn.Module, device: torch.device, precision: str):
        self.model, self.device, self.precision = model, device, precision

    def __call__(self, inputs: torch.Tensor, **extra: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            return self.model(inputs, **extra)

    def autocast(self) -> contextlib.AbstractContextManager:
        """The run's autocast context (for a frozen model's forward, e.g. a teacher or reference)."""
        return autocast_context(self.device, self.precision)


@dataclass(frozen=True)
class Layout:
    """What `Objective.setup` sees of the laid-out run.

    Attributes:
        policy: the trained model as laid out on this rank (gptforge.train.sources.base.ModelHandle).
        model, train, parallel: the resolved run's sections (gptforge.train.resolve.ResolvedRun).
        run_dir: the run folder (precomputed data an objective keeps beside the checkpoints).
        place: lays a frozen module out like the policy (device, tensor parallel, FSDP2
            sharding; no data-parallel wrapper, no optimizer), in eval mode without gradients
            (gptforge.train.parallel.parallelize.place_frozen); returns the module to call.
    """

    policy: ModelHandle
    model: ModelConfig
    train: TrainConfig
    parallel: ParallelConfig
    run_dir: Path
    place: Callable[[torch.nn.Module], torch.nn.Module]


class Objective(Protocol):
    """What a training step minimises (see the module docstring for the order of calls)."""

    @property
    def name(self) -> str:
        """How messages name it (e.g. "next-token loss", "distillation")."""
        ...

    @property
    def unit(self) -> Unit:
        """What `count` counts and the loss is summed over."""
        ...

    @property
    def supports_pipeline(self) -> bool:
        """Whether the loss is a function of the last stage's (logits, targets) alone (`pipeline_loss`)."""
        ...

    @property
    def metric_names(self) -> tuple[str, ...]:
        """Every name `loss` may put into `ObjectiveLoss.metrics` (fixed, so that every rank reduces
        the same figures, pipeline stages without a loss included)."""
        ...

    def loss_ceiling(self, vocab_size: int) -> float | None:
        """The per-unit loss above which a step has diverged whatever happened before (the spike
        alarm's absolute ceiling, gptforge.train.spikes), or None where no such bound exists."""
        ...

    def setup(self, layout: Layout) -> None:
        """Prepare what the loss needs beside the policy, once, after the layout is built."""
        ...

    def count(self, micro_batch: Any) -> int:
        """This micro-batch's units (tokens that count, sequences or pairs), read from the batch
        alone, before any forward."""
        ...

    def loss(self, forward: Forward, micro_batch: Any) -> ObjectiveLoss:
        """The micro-batch's summed loss (with grad) and metrics; `micro_batch` is on the device."""
        ...

    def pipeline_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The summed loss from the last pipeline stage's logits (b, T, V) and targets (b, T);
        called only when `supports_pipeline`."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """State a checkpoint carries (plain data or tensors; {} for none)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class ObjectiveBase:
    """Defaults of the optional `Objective` members: per-token, no pipeline, no metrics, no
    divergence ceiling, nothing to set up, no state. A subclass sets `name` and defines `count`
    and `loss`."""

    name: str = "objective"
    unit: Unit = "tokens"
    supports_pipeline: bool = False
    metric_names: tuple[str, ...] = ()

    def loss_ceiling(self, vocab_size: int) -> float | None:
        return None

    def setup(self, layout: Layout) -> None:
        return None

    def pipeline_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{self.name} does not run under pipeline parallelism")

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


def to_device(micro_batch: Any, device: torch.device) -> Any:
    """A micro-batch with its tensors on `device`: a tuple's tensor elements or a dict's tensor
    values are moved (non_blocking), anything else is kept as it is."""

    def move(v):
        return v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v

    if isinstance(micro_batch, dict):
        return {k: move(v) for k, v in micro_batch.items()}
    if isinstance(micro_batch, (tuple, list)):
        return type(micro_batch)(move(v) for v in micro_batch)
    return move(micro_batch)
