import json

import numpy as np
import pytest

from gptforge.train.spikes import SpikeDetector


def _curve(n=400, seed=0):
    """A loss curve like a real run's: fast fall, slow tail, per-batch noise; grad norm around 1."""
    rng = np.random.default_rng(seed)
    t = np.arange(1, n + 1)
    loss = 2.0 + 4.0 * np.exp(-t / 60) + rng.normal(0, 0.03, n)
    grad = 0.8 + 0.3 * np.exp(-t / 40) + np.abs(rng.normal(0, 0.05, n))
    return loss, grad


def _run(det, loss, grad, start=0):
    events = []
    for i in range(start, len(loss)):
        events += det.update(i + 1, {"step": i + 1, "loss": float(loss[i]), "grad_norm": float(grad[i])})
    return events


def test_one_injected_spike_is_found_and_nothing_else():
    loss, grad = _curve()
    assert _run(SpikeDetector(), loss, grad) == []  # no false alarm on a healthy curve
    loss[249] += 0.8  # step 250: loss only
    grad[319] *= 6  # step 320: gradient only
    loss[359] += 1.0  # step 360: both
    grad[359] *= 8
    ev = _run(SpikeDetector(grad_clip=1.0), loss, grad)
    assert [(e.step, e.metric, e.kind) for e in ev] == [(250, "loss", "spike"), (320, "grad_norm", "spike"),
                                                       (360, "grad_norm", "spike"), (360, "loss", "spike")]
    assert "unusual batch" in ev[0].advice
    assert "lower train.lr" in ev[1].advice and "grad_clip 1 capped" in ev[1].advice
    assert "with the loss" in ev[3].advice
    assert ev[0].score > 6 and ev[0].median == pytest.approx(np.median(loss[149:249]))
    d = np.diff(loss[149:249])
    assert ev[0].mad == pytest.approx(np.median(np.abs(d - np.median(d))))
    row = ev[0].as_dict()
    assert json.loads(json.dumps(row)) == row and row["kind"] == "spike"


def test_divergence_is_one_event_per_streak_and_non_finite_is_flagged():
    loss, grad = _curve(200)
    loss[150:160] += 3.0  # the loss leaves its level for 10 steps
    ev = [e for e in _run(SpikeDetector(divergence_after=3), loss, grad) if e.metric == "loss"]
    assert [(e.step, e.kind) for e in ev] == [(151, "spike"), (152, "spike"), (153, "divergence")]
    assert "diverging" in ev[-1].advice
    det = SpikeDetector(min_history=3, window=5)
    for s in range(1, 6):
        assert det.update(s, {"loss": 3.0, "grad_norm": None}) == []
    (nf,) = det.update(6, {"loss": float("nan")})
    assert nf.kind == "non_finite" and nf.as_dict()["value"] is None
    with pytest.raises(ValueError):
        SpikeDetector(window=10, min_history=20)


def test_state_dict_resume_gives_the_same_alarms():
    loss, grad = _curve()
    loss[[120, 260, 330]] += 1.0
    full = _run(SpikeDetector(), loss, grad)
    assert len(full) == 3
    first = SpikeDetector()
    part = _run(first, loss[:200], grad[:200])
    state = json.loads(json.dumps(first.state_dict()))  # survives a checkpoint as plain data
    second = SpikeDetector()
    second.load_state_dict(state)
    rest = _run(second, loss, grad, start=200)
    assert [e.as_dict() for e in part + rest] == [e.as_dict() for e in full]
    assert len(second.history["loss"]) == 100
    # A detector with a shorter window keeps the newest values of a longer one's state.
    short = SpikeDetector(window=30, min_history=10)
    short.load_state_dict(state)
    assert list(short.history["loss"]) == [float(v) for v in loss[170:200]]


def test_a_spike_needs_a_relative_jump_too():
    """LoRA grad norms that barely move made +10% a robust z of ~29 (issue 41 item 5): no alarm
    without a relative jump (MIN_RELATIVE_JUMP) as well."""
    from gptforge.train.spikes import MIN_RELATIVE_JUMP

    rng = np.random.default_rng(0)
    det = SpikeDetector()
    events = []
    for s in range(1, 101):
        events += det.update(s, {"loss": 2.0 + rng.normal(0, 1e-4), "grad_norm": 0.3 + rng.normal(0, 1e-4)})
    assert events == []
    assert det.update(101, {"loss": 2.0, "grad_norm": 0.33}) == []  # +10%: a z near 30, not a spike
    assert det.update(102, {"loss": 2.0 * (1 + MIN_RELATIVE_JUMP["loss"] / 2), "grad_norm": 0.3}) == []
    (ev,) = det.update(103, {"loss": 2.0, "grad_norm": 0.3 * (1 + 2 * MIN_RELATIVE_JUMP["grad_norm"])})
    assert ev.metric == "grad_norm" and ev.score > 6
    (ev,) = det.update(104, {"loss": 2.0 * (1 + 2 * MIN_RELATIVE_JUMP["loss"]), "grad_norm": 0.3})
    assert ev.metric == "loss"
