"""Metric values computed by hand."""

import math

import pytest

from gptforge.eval.metrics import (
    centered_aggregate,
    classification_report,
    exact_match,
    mean_metric,
    mean_stderr,
    metric,
    squad_normalize,
    token_f1,
)


def test_mean_stderr_uses_the_sample_standard_deviation():
    # mean 0.75; sum of squared deviations 3 * 0.0625 + 0.5625 = 0.75; /3 -> var 0.25; std 0.5; /sqrt(4)
    assert mean_stderr([1, 0, 1, 1]) == pytest.approx(0.25)
    assert mean_metric([1, 0, 1, 1]) == {"value": 0.75, "stderr": pytest.approx(0.25), "n": 4}
    assert mean_stderr([1.0]) == 0.0


def test_classification_report_by_hand():
    gold = [0, 0, 1, 1, 2]
    pred = [0, 1, 1, 1, 0]
    rep = classification_report(gold, pred, ["a", "b", "c"])
    m = rep["metrics"]
    assert m["acc"]["value"] == pytest.approx(0.6) and m["acc"]["n"] == 5
    assert m["micro_f1"]["value"] == pytest.approx(0.6)
    # a: tp 1 of 2 predicted, 1 of 2 true -> P = R = F1 = 0.5
    assert m["precision/a"]["value"] == pytest.approx(0.5) and m["precision/a"]["n"] == 2
    assert m["recall/a"]["value"] == pytest.approx(0.5) and m["recall/a"]["n"] == 2
    assert m["f1/a"]["value"] == pytest.approx(0.5)
    # b: tp 2 of 3 predicted, 2 of 2 true -> P 2/3, R 1, F1 0.8
    assert m["precision/b"]["value"] == pytest.approx(2 / 3)
    assert m["recall/b"]["value"] == pytest.approx(1.0)
    assert m["f1/b"]["value"] == pytest.approx(0.8)
    # c: never predicted -> precision 0 over n 0; its one true member missed
    assert m["precision/c"] == {"value": 0.0, "stderr": 0.0, "n": 0}
    assert m["recall/c"]["value"] == 0.0 and m["f1/c"]["value"] == 0.0
    assert m["macro_f1"]["value"] == pytest.approx((0.5 + 0.8 + 0.0) / 3)
    assert 0 < m["macro_f1"]["stderr"] < 0.5
    assert rep["confusion_matrix"] == {"labels": ["a", "b", "c"], "matrix": [[1, 1, 0], [0, 2, 0], [1, 0, 0]]}


def test_classification_report_agrees_with_scikit_learn():
    sk = pytest.importorskip("sklearn.metrics")
    gold = [0, 1, 2, 2, 1, 0, 0, 2, 1, 1]
    pred = [0, 2, 2, 1, 1, 0, 1, 2, 1, 0]
    m = classification_report(gold, pred, ["x", "y", "z"])["metrics"]
    assert m["macro_f1"]["value"] == pytest.approx(sk.f1_score(gold, pred, average="macro"))
    assert m["micro_f1"]["value"] == pytest.approx(sk.f1_score(gold, pred, average="micro"))
    p, r, f, _ = sk.precision_recall_fscore_support(gold, pred, zero_division=0)
    for c, name in enumerate("xyz"):
        assert m[f"precision/{name}"]["value"] == pytest.approx(p[c])
        assert m[f"recall/{name}"]["value"] == pytest.approx(r[c])
        assert m[f"f1/{name}"]["value"] == pytest.approx(f[c])


def test_squad_normalisation_exact_match_and_f1():
    assert squad_normalize("The  Cat, sat!") == "cat sat"
    assert exact_match("The Cat!", ["dog", "cat"]) == 1.0
    assert exact_match("cats", ["cat"]) == 0.0
    # tokens [big, cat] vs [cat, sat]: 1 common -> P = R = 1/2 -> F1 1/2
    assert token_f1("the big cat", ["a cat sat"]) == pytest.approx(0.5)
    assert token_f1("the big cat", ["a cat sat", "big cat"]) == pytest.approx(1.0)
    assert token_f1("", ["a"]) == 1.0  # both normalise to nothing
    assert token_f1("dog", ["cat"]) == 0.0


def test_centered_aggregate_by_hand():
    agg = centered_aggregate({"t1": (metric(0.75, 0.1, 100), 0.25), "t2": (metric(0.5, 0.2, 50), 0.5)})
    # (0.75-0.25)/0.75 = 2/3 and (0.5-0.5)/0.5 = 0 -> 1/3
    assert agg["value"] == pytest.approx(1 / 3)
    assert agg["stderr"] == pytest.approx(math.sqrt(0.01 / 0.5625 + 0.04 / 0.25) / 2)
    assert agg["n"] == 150
