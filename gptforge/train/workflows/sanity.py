"""The overfit sanity check: a model that cannot memorise one batch will not learn a corpus.

`sanity_overfit` trains on the same micro-batches at every step (those of step 0) for
train.max_steps steps with the normal trainer. A correct model, loss and optimizer drive the
loss on that batch towards 0; the check passes when it falls below `threshold` nats/token
(default 0.1). When it does not, the advice lists what usually causes it: a learning rate far off,
targets not shifted against inputs, a mask that hides the targets, labels that change between
steps, or gradients that never reach the weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gptforge.runtime.loss import IGNORE_INDEX
from gptforge.train.sources import BatchSource, FixedBatchSource

SANITY_THRESHOLD = 0.1
"""Train loss (nats/token) the fixed batch must fall below for the check to pass."""

ADVICE = (
    "train.lr: too low to move in this many steps, or so high the loss diverges (try 1e-3 to 3e-3 for a "
    "small model, with train.warmup_steps a few percent of the steps)",
    "the targets: they must be the inputs shifted by one token (y[t] = x[t+1]), with -100 only where nothing counts",
    "masking: an attention mask or labels of -100 that hide every target (data that is all padding)",
    "labels that change between steps for the same inputs (shuffled or misaligned targets)",
    "gradients: a .detach(), torch.no_grad() or requires_grad=False between the loss and the weights",
    "model.dropout: high dropout slows memorisation (use 0 for this check)",
)


@dataclass
class SanityResult:
    """How the check went: the first and final train loss (nats/token) and the verdict."""

    passed: bool
    first_loss: float | None
    final_loss: float | None
    steps: int
    threshold: float
    reason: str
    advice: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if self.passed:
            return (f"sanity check passed: the loss on one fixed batch fell from {self.first_loss:.3f} to "
                    f"{self.final_loss:.4f} nats/token (< {self.threshold}) in {self.steps} steps")
        lines = [f"sanity check FAILED: {self.reason}", "check:"] + [f"  - {a}" for a in self.advice]
        return "\n".join(lines)


def sanity_overfit(cfg, data_dir: str | Path, run_dir: str | Path, threshold: float = SANITY_THRESHOLD,
                   source: BatchSource | None = None, model_factory=None, progress: bool = True,
                   log=None) -> SanityResult:
    """Train `cfg` on one fixed batch of `data_dir` (or `source`) for train.max_steps steps into
    `run_dir` and judge whether the model memorised it (see the module docstring).

    Evaluation, the report and spike alarms are off for the check; checkpoints are written only
    at the end. Returns a SanityResult (it does not raise for a failed check).
    """
    import dataclasses

    from gptforge.config import RunConfig
    from gptforge.train.run import train
    from gptforge.train.sources import ShardSource

    tc = dataclasses.replace(cfg.train, eval_interval=0, checkpoint_interval=0, report=False, spike_alarms=False,
                             patience=0)
    inner = source if source is not None else ShardSource(data_dir, eval_steps=1, micro_batch_size=tc.micro_batch_size)
    fixed = FixedBatchSource(inner)
    result = train(RunConfig(model=cfg.model, train=tc, parallel=cfg.parallel), data_dir, run_dir,
                   progress=progress, log=log, data=fixed, model_factory=model_factory)
    counted = sum(int((mb[1] != IGNORE_INDEX).sum()) if isinstance(mb, tuple) else int((mb["labels"] != IGNORE_INDEX).sum())
                  for mb in fixed_batches_of(fixed))
    losses = [r["loss"] for r in result.history]
    first, final = (losses[0], losses[-1]) if losses else (None, None)
    if counted == 0:
        return SanityResult(False, first, final, result.step, threshold,
                            "no target token counts in the batch (every label is -100): the loss is 0 by "
                            "construction and nothing is learned", list(ADVICE[1:3]))
    if final is not None and final == final and final < threshold:
        return SanityResult(True, first, final, result.step, threshold, "")
    return SanityResult(False, first, final, result.step, threshold,
                        f"the loss on one fixed batch went from {first:.3f} to {final:.3f} nats/token in "
                        f"{result.step} steps, not below {threshold}", list(ADVICE))


def fixed_batches_of(source: FixedBatchSource) -> list:
    """The micro-batches the check trained on (after the run)."""
    return source.last_batches.micro_batches(0) if source.last_batches is not None else []
