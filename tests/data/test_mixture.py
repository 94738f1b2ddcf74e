"""The mixture sampler: exact proportions per window, rank-independent batches, epochs, resume."""

import json

import numpy as np
import pytest

from gptforge.data.mixture import MixtureSampler, normalize_weights, proportional_weights

SIZES = {"en": 500, "zh": 120, "code": 37}
WEIGHTS = {"en": 0.6, "zh": 0.3, "code": 0.1}


def _per_step_counts(sampler: MixtureSampler, steps: int, dp_size: int) -> np.ndarray:
    """(steps, sources) sequences drawn, read back from every rank's slice (what the ranks train on)."""
    rows = []
    for step in range(steps):
        batch = sampler.global_batch(step)
        seen = [name for r in range(dp_size) for name, _ in batch.rank_slice(r, dp_size)]
        rows.append([seen.count(s) for s in SIZES])
    return np.array(rows)


@pytest.mark.parametrize("dp_size", [1, 2])
@pytest.mark.parametrize("global_batch_size", [2, 6, 16])
def test_every_window_of_100_steps_is_within_one_percent(dp_size, global_batch_size):
    counts = _per_step_counts(MixtureSampler(SIZES, WEIGHTS, global_batch_size, seed=5), 400, dp_size)
    assert (counts.sum(1) == global_batch_size).all()
    w = np.array(list(WEIGHTS.values()))
    cum = np.vstack([np.zeros(3), counts.cumsum(0)])
    for start in range(0, 400 - 100 + 1):
        frac = (cum[start + 100] - cum[start]) / (100 * global_batch_size)  # equal-length sequences: tokens
        assert np.abs(frac - w).max() < 0.01, (start, frac)


def test_the_global_batch_is_the_same_on_one_and_two_ranks():
    one, two = MixtureSampler(SIZES, WEIGHTS, 8, seed=2), MixtureSampler(SIZES, WEIGHTS, 8, seed=2)
    for step in range(50):
        b1, b2 = one.global_batch(step), two.global_batch(step)
        assert b1.rank_slice(0, 1) == b2.rank_slice(0, 2) + b2.rank_slice(1, 2)
        assert len(b2.rank_slice(1, 2)) == 4
    with pytest.raises(ValueError, match="multiple of the number of ranks"):
        one.global_batch(50).rank_slice(0, 3)


def test_each_source_visits_every_sequence_once_per_epoch_in_a_new_order():
    s = MixtureSampler(SIZES, WEIGHTS, 10, seed=0)
    drawn = {name: [] for name in SIZES}
    for step in range(200):
        for name, i in s.global_batch(step).items:
            drawn[name].append(i)
    code = drawn["code"]  # 200 steps * 10 * 0.1 = 200 draws of 37 sequences: 5 full epochs
    epochs = [code[e * 37 : (e + 1) * 37] for e in range(5)]
    assert all(sorted(e) == list(range(37)) for e in epochs)
    assert epochs[0] != epochs[1]
    assert s.epochs() == {"en": 2, "zh": 5, "code": 5}  # 1200/500, 600/120, 200/37
    assert s.global_batch(199).epochs == s.epochs()


def test_resume_from_state_dict_is_exact():
    full = MixtureSampler(SIZES, WEIGHTS, 6, seed=9)
    expected = [full.global_batch(step).items for step in range(90)]
    first = MixtureSampler(SIZES, WEIGHTS, 6, seed=9)
    for step in range(37):
        first.global_batch(step)
    state = json.loads(json.dumps(first.state_dict()))  # survives a JSON checkpoint
    resumed = MixtureSampler(SIZES, WEIGHTS, 6, seed=9)
    resumed.load_state_dict(state)
    assert [resumed.global_batch(step).items for step in range(37, 90)] == expected[37:]
    # Any step can also be recomputed from scratch, or after skipping ahead.
    assert MixtureSampler(SIZES, WEIGHTS, 6, seed=9).global_batch(60).items == expected[60]
    assert resumed.global_batch(10).items == expected[10]
    with pytest.raises(ValueError, match="seed"):
        MixtureSampler(SIZES, WEIGHTS, 6, seed=10).load_state_dict(state)
    with pytest.raises(ValueError, match="weights"):
        MixtureSampler(SIZES, {"en": 1, "zh": 1, "code": 1}, 6, seed=9).load_state_dict(state)


def test_another_seed_gives_another_order_with_the_same_counts():
    a, b = MixtureSampler(SIZES, WEIGHTS, 8, seed=1), MixtureSampler(SIZES, WEIGHTS, 8, seed=2)
    assert a.global_batch(0).counts == b.global_batch(0).counts
    assert a.global_batch(0).items != b.global_batch(0).items


def test_repetition_beyond_four_epochs_is_flagged():
    s = MixtureSampler(SIZES, WEIGHTS, 10, seed=0)
    assert s.planned_epochs(100)["code"] == pytest.approx(100 / 37)
    assert s.repetition_warnings(100) == []
    zh, code = s.repetition_warnings(200)  # en 2.4 epochs, zh 200 * 3 / 120 = 5.0, code 200 / 37 = 5.4
    assert "'zh'" in zh and "5.0 epochs" in zh
    assert "'code'" in code and "5.4 epochs" in code and "Muennighoff" in code


def test_weights_are_checked_and_normalized():
    assert normalize_weights({"a": 3, "b": 1}, ["a", "b"]) == {"a": 0.75, "b": 0.25}
    assert proportional_weights({"a": 30, "b": 10}) == {"a": 0.75, "b": 0.25}
    with pytest.raises(ValueError, match="did you mean 'english'"):
        normalize_weights({"englsh": 1, "zh": 1}, ["english", "zh"])
    with pytest.raises(ValueError, match="no data weight for source"):
        normalize_weights({"en": 1}, ["en", "zh"])
    with pytest.raises(ValueError, match=">= 0"):
        normalize_weights({"en": 1, "zh": -1}, ["en", "zh"])
    with pytest.raises(ValueError, match="every data weight is 0"):
        normalize_weights({"en": 0, "zh": 0}, ["en", "zh"])
    zero = MixtureSampler({"a": 5, "b": 5}, {"a": 1, "b": 0}, 4, seed=0)
    assert all(name == "a" for name, _ in zero.global_batch(3).items)


def test_stages_change_the_weights_at_the_boundary_and_stay_exact():
    stages = [(50, {"en": 0.2, "zh": 0.2, "code": 0.6})]
    s = MixtureSampler(SIZES, WEIGHTS, 10, seed=1, stages=stages)
    assert s.weights_at(49) == pytest.approx({"en": 0.2, "zh": 0.2, "code": 0.6})
    assert s.weights_at(50) == pytest.approx(WEIGHTS)
    counts = np.array([[s.global_batch(t).counts[n] for n in SIZES] for t in range(150)])
    assert (counts.sum(1) == 10).all()
    cum = counts.cumsum(0)
    target = np.array([0.2, 0.2, 0.6]) * 10 * 50 + np.array(list(WEIGHTS.values())) * 10 * np.arange(1, 101)[:, None]
    assert np.abs(cum[49] - np.array([100, 100, 300])).max() < 1
    assert np.abs(cum[50:] - target).max() < 1  # within one sequence of the cumulative quota after the boundary
    assert s.planned_epochs(150)["code"] == pytest.approx((0.6 * 500 + 0.1 * 1000) / 37)
    # Resume across the boundary: a fresh sampler loaded at step 40 gives the same batches.
    again = MixtureSampler(SIZES, WEIGHTS, 10, seed=1, stages=stages)
    again.global_batch(39)
    state = again.state_dict()
    resumed = MixtureSampler(SIZES, WEIGHTS, 10, seed=1, stages=stages)
    resumed.load_state_dict(state)
    assert [resumed.global_batch(t).items for t in range(40, 70)] == [s.global_batch(t).items for t in range(40, 70)]
    with pytest.raises(ValueError, match="stages"):
        MixtureSampler(SIZES, WEIGHTS, 10, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="increasing"):
        MixtureSampler(SIZES, WEIGHTS, 10, seed=1, stages=[(50, WEIGHTS), (50, WEIGHTS)])
