"""Loss-spike and divergence alarms: a rolling median / MAD detector on train loss and grad norm.

A value is a spike when its robust z-score against the last `window` values x_1..x_n of the
same metric,

    z = (x - median(x_i)) / sigma,      sigma = 1.4826 * MAD(x_i - x_{i-1}) / sqrt(2),

exceeds `threshold` (upward only: a sudden drop is not an alarm) and the value is also above
the median by MIN_RELATIVE_JUMP of it (x > median x (1 + r)): a metric that barely moves (LoRA
grad norms, a late flat loss) has so small a noise scale that a +10% change scores a z of 30, and
such a change is no spike. A median / MAD score is not
dragged by the outliers it looks for (Iglewicz & Hoaglin 1993, "How to Detect and Handle
Outliers"; Leys et al. 2013, "Detecting outliers: Do not use standard deviation around the mean,
use absolute deviation around the median"); 1.4826 makes a MAD a consistent estimate of a normal
distribution's standard deviation. The noise scale comes from the MAD of consecutive differences
(divided by sqrt 2, the standard deviation of a difference of two independent draws) rather
than of the values themselves, because a loss curve falls within any window: the spread of the
values measures the trend, not the step-to-step noise a spike stands out from.
`divergence_after` loss spikes in a row raise one "divergence" event instead.

The window needs `min_history` steps, so a run that diverges from its first steps would go
unnoticed. An absolute rule covers it from step 1: a train loss above `loss_ceiling`, for
next-token cross-entropy `divergence_loss_ceiling(V) = ln V + DIVERGENCE_MARGIN_NATS`, is a
"divergence" event too. ln V is the loss of a uniform guess over the V-token vocabulary (what a
freshly initialised model scores, give or take a few tenths of a nat); a model worse than that by
2 nats puts far more probability on wrong tokens than knowing nothing would, which no healthy run
does at any step. One event per episode: the loss must come back below the ceiling before the rule
fires again.

The trainer calls `update(step, row)` once per optimizer step with the metrics row; each returned
`SpikeEvent.as_dict()` goes into the row's `"events"` list (metrics.jsonl), and the run report
marks it. Its state travels in the checkpoint through `state_dict()` / `load_state_dict()`, so a
resumed run keeps the window it had.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from itertools import pairwise
from typing import Any

DIVERGENCE_MARGIN_NATS = 2.0
"""How far above ln(vocab_size) a cross-entropy train loss must be to count as diverged."""


def divergence_loss_ceiling(vocab_size: int, margin: float = DIVERGENCE_MARGIN_NATS) -> float:
    """ln(vocab_size) + margin, nats: the absolute divergence bound on a next-token cross-entropy loss.

    ln V is the cross-entropy of a uniform distribution over V tokens (Shannon 1948); see the
    module docstring for the margin.

    Raises:
        ValueError: vocab_size < 2 or margin <= 0.
    """
    if vocab_size < 2 or margin <= 0:
        raise ValueError(f"divergence_loss_ceiling: need vocab_size >= 2 and margin > 0, got {vocab_size}, {margin}")
    return math.log(vocab_size) + margin


MAD_TO_SIGMA = 1.4826
"""1 / Phi^-1(3/4): the MAD of a normal distribution times this is its standard deviation."""


@dataclass
class SpikeEvent:
    """One alarm. `kind` is "spike", "divergence" or "non_finite"; `metric` is "loss" or "grad_norm"."""

    step: int
    kind: str
    metric: str
    value: float
    median: float
    """Median of the window (nan when the window is still short)."""
    mad: float
    """MAD of the window's consecutive differences (sigma = 1.4826 * mad / sqrt 2)."""
    score: float
    """Robust z-score (inf for a non-finite value; nan when the window is still short)."""
    advice: str
    ceiling: float | None = None
    """The absolute loss ceiling exceeded (`divergence_loss_ceiling`), or None for a window alarm."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (non-finite numbers become None), for a metrics row's `events` list."""
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}

    def message(self) -> str:
        """One line for the progress output."""
        if self.kind == "non_finite":
            return f"step {self.step}: {self.metric} is not finite. {self.advice}"
        if self.ceiling is not None:
            return (f"step {self.step}: {self.metric} {self.kind} {self.value:.4g} (above the ceiling "
                    f"{self.ceiling:.4g} = ln(vocab) + margin). {self.advice}")
        return (f"step {self.step}: {self.metric} {self.kind} {self.value:.4g} (median {self.median:.4g}, "
                f"robust z {self.score:.1f}). {self.advice}")


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


#: the relative jump above the window's median a value needs, besides its z-score, to be a spike
#: (the injected spikes the tests find, and those of real runs, are +30% and more in loss, x2 and
#: more in grad norm).
MIN_RELATIVE_JUMP = {"loss": 0.1, "grad_norm": 0.5}


class SpikeDetector:
    """Rolling median / MAD spike detector (see the module docstring).

    Args:
        window: values kept per metric (the last N steps).
        threshold: robust z-score above which a value is a spike.
        min_history: values needed before any alarm (the first steps of a run move fast).
        divergence_after: this many consecutive loss spikes give one "divergence" event.
        metrics: row keys watched.
        grad_clip: the run's train.grad_clip (0: off), for the advice.
        warmup_steps: the run's train.warmup_steps, for the advice.
        loss_ceiling: a loss above this is a "divergence" event from the first step, once per
            episode (`divergence_loss_ceiling(vocab_size)` for cross-entropy; None: off).

    Raises:
        ValueError: window < 3, min_history < 3 or > window, or threshold <= 0.
    """

    def __init__(self, window: int = 100, threshold: float = 6.0, min_history: int = 20, divergence_after: int = 3,
                 metrics: tuple[str, ...] = ("loss", "grad_norm"), grad_clip: float = 0.0, warmup_steps: int = 0,
                 loss_ceiling: float | None = None):
        if window < 3 or not 3 <= min_history <= window or threshold <= 0:
            raise ValueError(f"SpikeDetector: need window >= 3, 3 <= min_history <= window and threshold > 0; got "
                             f"window={window}, min_history={min_history}, threshold={threshold}")
        self.window, self.threshold, self.min_history = window, threshold, min_history
        self.divergence_after, self.metrics = divergence_after, tuple(metrics)
        self.grad_clip, self.warmup_steps = grad_clip, warmup_steps or 0  # None: unset (unresolved)
        self.history: dict[str, deque[float]] = {m: deque(maxlen=window) for m in self.metrics}
        self.loss_spikes_in_row = 0
        self.loss_ceiling = loss_ceiling
        self.above_ceiling = False
        """Whether the last finite loss was above loss_ceiling (an episode already reported)."""

    def update(self, step: int, row: dict[str, Any]) -> list[SpikeEvent]:
        """Check this step's values (row[metric] for each watched metric), then add them to the window.

        Args:
            step: the optimizer step (1-based, as in metrics.jsonl).
            row: the metrics row; a missing or None metric is ignored.

        Returns: the alarms of this step (empty when all is well).
        """
        events: list[SpikeEvent] = []
        stats: dict[str, tuple[float, float, float]] = {}
        self._check_ceiling(step, row, events)
        for m in self.metrics:
            v = row.get(m)
            if v is None or isinstance(v, bool):
                continue
            v = float(v)
            hist = self.history[m]
            if not math.isfinite(v):
                events.append(SpikeEvent(step, "non_finite", m, v, math.nan, math.nan, math.inf,
                                         "The step is skipped; several in a row stop the run. Lower train.lr, "
                                         "or use bf16 instead of fp16."))
                continue
            if len(hist) >= self.min_history:
                values = list(hist)
                med = _median(values)
                diffs = [b - a for a, b in pairwise(values)]
                dmed = _median(diffs)
                mad = _median([abs(d - dmed) for d in diffs])
                # A flat window (MAD 0) would make any change infinite: floor the scale.
                scale = max(MAD_TO_SIGMA * mad / math.sqrt(2.0), 1e-3 * abs(med), 1e-12)
                stats[m] = (med, mad, (v - med) / scale)
            hist.append(v)
        spiked = {m for m, (med, _, z) in stats.items()
                  if z > self.threshold and float(row[m]) > med + MIN_RELATIVE_JUMP.get(m, 0.0) * abs(med)}
        self.loss_spikes_in_row = self.loss_spikes_in_row + 1 if "loss" in spiked else 0
        for m in sorted(spiked):
            if m == "loss" and self.above_ceiling:
                continue  # the ceiling event said it when this episode began (or says it now)
            med, mad, z = stats[m]
            kind = "spike"
            if m == "loss" and self.divergence_after and self.loss_spikes_in_row >= self.divergence_after:
                if self.loss_spikes_in_row > self.divergence_after:
                    continue  # one divergence event per streak
                kind = "divergence"
            events.append(SpikeEvent(step, kind, m, float(row[m]), med, mad, z, self._advice(step, m, kind, spiked, row)))
        return events

    def _check_ceiling(self, step: int, row: dict[str, Any], events: list[SpikeEvent]) -> None:
        """The absolute rule: append a divergence event when the loss first goes above the ceiling."""
        v = row.get("loss") if "loss" in self.metrics else None
        if self.loss_ceiling is None or v is None or isinstance(v, bool) or not math.isfinite(float(v)):
            return
        was, self.above_ceiling = self.above_ceiling, float(v) > self.loss_ceiling
        if not self.above_ceiling or was:
            return
        hist = list(self.history["loss"])
        med = _median(hist) if hist else math.nan
        events.append(SpikeEvent(
            step, "divergence", "loss", float(v), med, math.nan, math.nan,
            "The loss is worse than a uniform guess over the vocabulary: the run is diverging. Restart or "
            "resume from an earlier checkpoint with a lower train.lr (3-10x), more train.warmup_steps, or "
            "train.grad_clip 1.0.", ceiling=self.loss_ceiling))

    def _advice(self, step: int, metric: str, kind: str, spiked: set[str], row: dict[str, Any]) -> str:
        if kind == "divergence":
            return (f"The loss stayed far above its recent median for {self.divergence_after} steps: the run is "
                    "diverging. Resume from the last good checkpoint with a lower train.lr (2-3x), more "
                    "train.warmup_steps, or train.grad_clip 1.0.")
        tips = []
        if step <= 2 * self.warmup_steps:  # during or just after warmup
            tips.append("more train.warmup_steps")
        if metric == "loss" and "grad_norm" not in spiked:
            return ("The loss jumped without a gradient spike: an unusual batch is the likely cause (look at the data "
                    "at this step); if spikes recur, lower train.lr.")
        tips.insert(0, "lower train.lr")
        if self.grad_clip <= 0:
            tips.append("turn on train.grad_clip (1.0)")
        elif metric == "grad_norm" and float(row[metric]) > self.grad_clip:
            tips.append(f"train.grad_clip {self.grad_clip:g} capped this update; a lower clip bounds it further")
        return "Gradient norm spiked" + (" with the loss" if "loss" in spiked else "") + ": " + "; ".join(tips) + "."

    def state_dict(self) -> dict[str, Any]:
        """Windows and streak, for the checkpoint (plain lists and numbers)."""
        return {"history": {m: list(h) for m, h in self.history.items()}, "loss_spikes_in_row": self.loss_spikes_in_row,
                "above_ceiling": self.above_ceiling}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()` output (windows longer than this detector's are cut to the newest)."""
        for m, values in state.get("history", {}).items():
            self.history[m] = deque((float(v) for v in values), maxlen=self.window)
        self.loss_spikes_in_row = int(state.get("loss_spikes_in_row", 0))
        self.above_ceiling = bool(state.get("above_ceiling", False))
