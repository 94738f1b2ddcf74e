"""The run report's plotly figures: one function per chart, every run of the report overlaid.

Each function takes the runs (`gptforge.report.run_data.RunData`) and returns a
`plotly.graph_objects.Figure`, or None when no run has the series (the page then says which
metrics.jsonl key is absent). Curves longer than `max_points` are shortened with
`minmax_downsample`, which keeps every spike.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative

from gptforge.report.downsample import minmax_downsample
from gptforge.report.run_data import KNOWN_KEYS, RunData

MAX_POINTS = 2000
"""Points per drawn curve (after min/max downsampling)."""

_PALETTE = qualitative.Plotly


def color(i: int) -> str:
    """The colour of the i-th run."""
    return _PALETTE[i % len(_PALETTE)]


def ema_weight(n: int) -> float:
    """Smoothing weight for a curve of n points: 1 - 20/n, clipped to [0.6, 0.98] (about n/20
    steps of memory: short runs stay responsive, long runs get a readable trend)."""
    return float(min(0.98, max(0.6, 1.0 - 20.0 / max(n, 1))))


def smooth(y, weight: float) -> np.ndarray:
    """Debiased exponential moving average (TensorBoard's smoothing): s_t = w s_{t-1} + (1-w) y_t,
    reported as s_t / (1 - w^t) so the first points are not pulled toward zero.

    Args:
        y: 1-D sequence of N finite values.
        weight: w in [0, 1).
    Returns: float64 array of shape (N,).
    """
    y = np.asarray(y, dtype=np.float64)
    out = np.empty_like(y)
    s = 0.0
    for t, v in enumerate(y, start=1):
        s = weight * s + (1.0 - weight) * v
        out[t - 1] = s / (1.0 - weight ** t)
    return out


def _name(runs: list[RunData], run: RunData, what: str) -> str:
    return what if len(runs) == 1 else f"{run.label}: {what}"


def _layout(fig: go.Figure, title: str, ytitle: str, log_y: bool = False) -> go.Figure:
    fig.update_layout(title=title, template="plotly_white", height=330, margin=dict(l=60, r=20, t=45, b=40),
                      hovermode="x unified", legend=dict(orientation="h", y=-0.18))
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text=ytitle, type="log" if log_y else "linear")
    return fig


def _line(runs, run, i, key, what, *, dash=None, smooth_it=False, width=1.5, opacity=1.0, scale=1.0,
          mode="lines") -> list[go.Scatter]:
    xs, ys = run.series(key)
    if not xs:
        return []
    ys = [v * scale for v in ys]
    traces = []
    if smooth_it:
        sx, sy = minmax_downsample(xs, smooth(ys, ema_weight(len(ys))), MAX_POINTS)
        traces.append(go.Scatter(x=sx, y=sy, mode="lines", name=_name(runs, run, what + " (smoothed)"),
                                 line=dict(color=color(i), width=2.2), legendgroup=run.label))
        opacity, width = 0.35, 1.0
    dx, dy = minmax_downsample(xs, ys, MAX_POINTS)
    traces.insert(0, go.Scatter(x=dx, y=dy, mode=mode, name=_name(runs, run, what), opacity=opacity,
                                line=dict(color=color(i), width=width, dash=dash), legendgroup=run.label))
    return traces


def _marks(fig: go.Figure, runs: list[RunData], key: str, scale: float = 1.0) -> None:
    """Resumes as dashed vertical lines, rollbacks (train.spike_action rollback) as dotted ones at
    the step that rolled back; skipped steps (loss chart) and spike events on `key`."""
    for i, run in enumerate(runs):
        for s in run.resumes:
            fig.add_vline(x=s, line=dict(color=color(i), dash="dash", width=1),
                          annotation_text="resumed" if len(runs) == 1 else f"{run.label} resumed",
                          annotation_position="top left", annotation_font_size=10)
        for e in run.events:
            if e.get("kind") == "rollback":
                text = f"rolled back to {e.get('to_step')}"
                fig.add_vline(x=e["step"], line=dict(color="#9467bd", dash="dot", width=1.5),
                              annotation_text=text if len(runs) == 1 else f"{run.label} {text}",
                              annotation_position="top right", annotation_font_size=10)
        if key == "loss":
            skipped = [r for r in run.rows if r.get("skipped") or not _finite(r.get("loss"))]
            if skipped:
                xs, ys = run.series("loss")
                fallback = ys[-1] if ys else 0.0
                fig.add_trace(go.Scatter(
                    x=[r["step"] for r in skipped],
                    y=[r["loss"] if _finite(r.get("loss")) else _nearest(xs, ys, r["step"], fallback) for r in skipped],
                    mode="markers", marker=dict(symbol="x", size=9, color="#d62728"),
                    name=_name(runs, run, "skipped step (non-finite)"), legendgroup=run.label))
        spikes = [e for e in run.events if e.get("kind") in ("spike", "divergence") and e.get("metric") == key
                  and _finite(e.get("value"))]
        if spikes:
            fig.add_trace(go.Scatter(
                x=[e["step"] for e in spikes], y=[e["value"] * scale for e in spikes], mode="markers",
                marker=dict(symbol="triangle-up", size=11, color="#ff7f0e", line=dict(color="#000", width=1)),
                text=[str(e.get("advice", "")) for e in spikes], hovertemplate="spike at step %{x}: %{y:.4g}<br>%{text}<extra></extra>",
                name=_name(runs, run, "spike"), legendgroup=run.label))


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _nearest(xs: list[int], ys: list[float], step: int, fallback: float) -> float:
    if not xs:
        return fallback
    j = int(np.argmin(np.abs(np.asarray(xs) - step)))
    return ys[j]


def loss_chart(runs: list[RunData]) -> go.Figure | None:
    """Train loss (raw and smoothed) and val loss on the same axes, in nats/token."""
    fig = go.Figure()
    for i, run in enumerate(runs):
        for t in _line(runs, run, i, "loss", "train loss", smooth_it=True):
            fig.add_trace(t)
        for t in _line(runs, run, i, "val_loss", "val loss", dash="dot", width=2.5, mode="lines+markers"):
            fig.add_trace(t)
    if not fig.data:
        return None
    _marks(fig, runs, "loss")
    return _layout(fig, "Loss", "loss (nats/token)")


def simple_chart(runs: list[RunData], key: str, title: str, ytitle: str, *, scale: float = 1.0,
                 log_y: bool = False) -> go.Figure | None:
    """One curve per run of metrics key `key` (times `scale`), with resumes and spikes marked."""
    fig = go.Figure()
    for i, run in enumerate(runs):
        for t in _line(runs, run, i, key, title.lower(), scale=scale):
            fig.add_trace(t)
    if not fig.data:
        return None
    _marks(fig, runs, key, scale)
    return _layout(fig, title, ytitle, log_y)


def grad_norm_chart(runs: list[RunData]) -> go.Figure | None:
    """Gradient norm (before clipping) with each run's `train.grad_clip` threshold."""
    fig = simple_chart(runs, "grad_norm", "Gradient norm", "global L2 norm (before clipping)", log_y=True)
    if fig is None:
        return None
    for i, run in enumerate(runs):
        clip = (run.config.get("train") or {}).get("grad_clip")
        xs, _ = run.series("grad_norm")
        if _finite(clip) and clip > 0 and xs:
            fig.add_trace(go.Scatter(x=[xs[0], xs[-1]], y=[clip, clip], mode="lines",
                                     line=dict(color=color(i), dash="dash", width=1),
                                     name=_name(runs, run, f"clip threshold {clip:g}"), legendgroup=run.label))
    return fig


def memory_chart(runs: list[RunData]) -> go.Figure | None:
    """Measured allocator peak per device beside the planner's prediction, in GiB (MiB when
    every value is under 1 GiB)."""
    fig = go.Figure()
    values = [v for run in runs for k in ("peak_memory_bytes", "predicted_memory_bytes") for v in run.series(k)[1]]
    unit, scale = ("GiB", 1 / 2**30) if values and max(values) >= 2**30 else ("MiB", 1 / 2**20)
    for i, run in enumerate(runs):
        for t in _line(runs, run, i, "peak_memory_bytes", "measured peak", scale=scale, width=2):
            fig.add_trace(t)
        for t in _line(runs, run, i, "predicted_memory_bytes", "planner prediction", scale=scale, dash="dash"):
            fig.add_trace(t)
    if not fig.data:
        return None
    _marks(fig, runs, "peak_memory_bytes", scale)
    return _layout(fig, "Memory per device", unit)


def eval_chart(runs: list[RunData]) -> go.Figure | None:
    """Validation perplexity exp(val loss) over steps."""
    fig = go.Figure()
    for i, run in enumerate(runs):
        xs, ys = run.series("val_loss")
        if xs:
            fig.add_trace(go.Scatter(x=xs, y=[math.exp(min(v, 700.0)) for v in ys], mode="lines+markers",
                                     name=_name(runs, run, "val perplexity"), line=dict(color=color(i)),
                                     legendgroup=run.label))
    if not fig.data:
        return None
    return _layout(fig, "Validation perplexity", "exp(val loss)", log_y=True)


REWARD_KEYS = ("rl/reward_mean", "eval/pass@1")
"""An RL run's training reward (mean over each step's rollouts) and held-out pass@1 (gptforge rl)."""


def reward_chart(runs: list[RunData]) -> go.Figure | None:
    """An RL run's mean training reward per step (raw and smoothed) and held-out pass@1 at each
    evaluation, on one axis (both are rewards, in the units of the run's reward); None for runs
    that logged neither."""
    fig = go.Figure()
    for i, run in enumerate(runs):
        for t in _line(runs, run, i, "rl/reward_mean", "train reward", smooth_it=True):
            fig.add_trace(t)
        for t in _line(runs, run, i, "eval/pass@1", "held-out pass@1", dash="dot", mode="lines+markers", width=2.2):
            fig.add_trace(t)
    if not fig.data:
        return None
    _marks(fig, runs, "rl/reward_mean")
    return _layout(fig, "Reward", "reward")


def other_metrics_chart(runs: list[RunData]) -> go.Figure | None:
    """Every other numeric metrics key (e.g. task scores), one curve per (run, key)."""
    fig = go.Figure()
    for i, run in enumerate(runs):
        for key in sorted(k for k in run.metric_keys() - KNOWN_KEYS - set(PREFERENCE_KEYS) - set(REWARD_KEYS)
                          if not k.startswith(("val/", "data/"))):
            for t in _line(runs, run, i, key, key, mode="lines+markers"):
                t.line.color = None  # one colour per key; runs differ in legend name
                fig.add_trace(t)
    if not fig.data:
        return None
    return _layout(fig, "Other logged metrics", "value")


PREFERENCE_KEYS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")
"""TRL's reward metrics that preference tuning logs per step (and as val/... on held-out pairs)."""


def preference_chart(runs: list[RunData]) -> go.Figure | None:
    """Preference tuning's implicit rewards (beta times the log-ratio against the reference) of the
    chosen and rejected answers, their margin and the share of pairs ranked right, per step (lines)
    and on the validation pairs (markers)."""
    fig = go.Figure()
    for i, run in enumerate(runs):
        for key in PREFERENCE_KEYS:
            for t in _line(runs, run, i, key, key, mode="lines"):
                t.line.color = None
                fig.add_trace(t)
            xs, ys = run.series(f"val/{key}")
            if xs:
                fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=_name(runs, run, f"val/{key}"),
                                         legendgroup=run.label))
    if not fig.data:
        return None
    return _layout(fig, "Preference rewards", "reward (nats x beta) / accuracy")


def stage_ends(run: RunData) -> list[int]:
    """The steps at which a run's mixture stages end (config.yaml's train.stages, resolved)."""
    return [int(st["until_step"]) for st in ((run.config.get("train") or {}).get("stages") or [])
            if isinstance(st, dict) and "until_step" in st]


def _stage_marks(fig: go.Figure, runs: list[RunData]) -> go.Figure:
    """Mixture stage boundaries (train.stages) as long-dashed vertical lines."""
    for i, run in enumerate(runs):
        for k, s in enumerate(stage_ends(run)):
            text = f"stage {k + 1} ends"
            fig.add_vline(x=s, line=dict(color=color(i), dash="longdash", width=1),
                          annotation_text=text if len(runs) == 1 else f"{run.label} {text}",
                          annotation_position="bottom right", annotation_font_size=10)
    return fig


def sources_chart(runs: list[RunData]) -> go.Figure | None:
    """A mixture's val loss per source (val/NAME/loss), one curve per (run, source)."""
    fig = go.Figure()
    for run in runs:
        for key in sorted(k for k in run.metric_keys() if k.startswith("val/") and k.endswith("/loss")):
            xs, ys = run.series(key)
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=_name(runs, run, key[4:-5]),
                                     legendgroup=run.label))
    if not fig.data:
        return None
    return _layout(fig, "Validation loss per source", "nats/token")


def all_charts(runs: list[RunData]) -> dict[str, tuple[go.Figure | None, str]]:
    """{chart id: (figure or None, the metrics key whose absence leaves it empty)} in page order;
    every chart marks the mixture stage boundaries."""
    charts = _all_charts(runs)
    return {k: (_stage_marks(f, runs) if f is not None else None, key) for k, (f, key) in charts.items()}


def _all_charts(runs: list[RunData]) -> dict[str, tuple[go.Figure | None, str]]:
    return {
        "loss": (loss_chart(runs), "loss"),
        "lr": (simple_chart(runs, "lr", "Learning rate", "lr"), "lr"),
        "grad_norm": (grad_norm_chart(runs), "grad_norm"),
        "tokens_per_second": (simple_chart(runs, "tokens_per_second", "Throughput", "tokens/s"), "tokens_per_second"),
        "mfu": (simple_chart(runs, "mfu", "MFU", "% of peak FLOP/s", scale=100.0), "mfu"),
        "step_seconds": (simple_chart(runs, "step_seconds", "Step time", "seconds"), "step_seconds"),
        "memory": (memory_chart(runs), "peak_memory_bytes / predicted_memory_bytes"),
        "eval": (eval_chart(runs), "val_loss"),
        "sources": (sources_chart(runs), "val/NAME/loss"),
        "preference": (preference_chart(runs), "rewards/margins"),
        "reward": (reward_chart(runs), "rl/reward_mean"),
        "other": (other_metrics_chart(runs), "(keys beyond the standard ones)"),
    }
