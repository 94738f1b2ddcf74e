"""Task metrics, each with its standard error and n.

- `mean_stderr`: standard error of a mean, sample standard deviation (n - 1) / sqrt(n), the
  formula lm-evaluation-harness reports for acc, acc_norm and exact match.
- `classification_report`: accuracy, per-class precision / recall / F1, macro and micro F1 and
  the confusion matrix of single-label predictions (micro F1 equals accuracy for one label per
  example). Precision and recall are means over the predicted / true members of a class, so their
  stderr is `mean_stderr` over those members; F1 values get a bootstrap stderr (Efron and
  Tibshirani 1993, ch. 6: the standard deviation of the statistic over resamples of the examples).
- `squad_normalize`, `exact_match`, `token_f1`: the SQuAD v1.1 answer normalisation (lower case,
  drop punctuation and the articles a/an/the, collapse whitespace) and its token-overlap F1
  (Rajpurkar et al. 2016, sec. 4), best over the reference answers.
- `pass_at_k`: the unbiased pass@k estimator of Chen et al. 2021 ("Evaluating Large Language Models
  Trained on Code", eq. 1) from n samples of which c are correct: 1 - C(n - c, k) / C(n, k).
- `centered_aggregate`: DCLM's CORE score (Li et al. 2024, "DataComp-LM", sec. 3.4 / appendix G):
  each task's accuracy rescaled so chance is 0 and a perfect score 1, (acc - chance) / (1 - chance),
  averaged over the tasks.
"""

from __future__ import annotations

import collections
import math
import re
import string
from collections.abc import Sequence

import numpy as np

BOOTSTRAP_ITERS = 1000
"""Resamples for bootstrap standard errors (fixed seed 0, so figures repeat exactly)."""


def metric(value: float, stderr: float | None, n: int) -> dict:
    """The record every figure is reported as: {"value", "stderr", "n"}."""
    return {"value": float(value), "stderr": None if stderr is None else float(stderr), "n": int(n)}


def mean_stderr(values: Sequence[float] | np.ndarray) -> float:
    """Standard error of the mean of `values`: sample std (ddof 1) / sqrt(n); 0.0 for n < 2."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) < 2:
        return 0.0
    return float(x.std(ddof=1) / math.sqrt(len(x)))


def mean_metric(values: Sequence[float]) -> dict:
    """`metric` of the mean of per-example values (accuracy from 0/1 values, EM, F1)."""
    x = np.asarray(values, dtype=np.float64)
    return metric(x.mean() if len(x) else float("nan"), mean_stderr(x), len(x))


def _f1_stats(gold: np.ndarray, pred: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-class (precision, recall, F1) with 0 where undefined; gold/pred (..., n) ints in [0, k)."""
    g = gold[..., None] == np.arange(k)
    p = pred[..., None] == np.arange(k)
    tp = (g & p).sum(-2).astype(np.float64)
    n_pred, n_true = p.sum(-2), g.sum(-2)
    prec = np.divide(tp, n_pred, out=np.zeros_like(tp), where=n_pred > 0)
    rec = np.divide(tp, n_true, out=np.zeros_like(tp), where=n_true > 0)
    denom = prec + rec
    f1 = np.divide(2 * prec * rec, denom, out=np.zeros_like(tp), where=denom > 0)
    return prec, rec, f1


def classification_report(gold: Sequence[int], pred: Sequence[int], labels: Sequence[str]) -> dict:
    """Metrics of single-label predictions over classes `labels` (indices into it).

    Returns: {"metrics": {"acc", "macro_f1", "micro_f1", "precision/<label>", "recall/<label>",
    "f1/<label>": `metric` records}, "confusion_matrix": {"labels": [...], "matrix": rows = true
    class, columns = predicted class}}. A class never predicted has precision 0 (n 0), as
    scikit-learn's zero_division=0; macro F1 averages the per-class F1 over all `labels`.
    """
    g = np.asarray(gold, dtype=np.int64)
    p = np.asarray(pred, dtype=np.int64)
    k, n = len(labels), len(g)
    correct = (g == p).astype(np.float64)
    prec, rec, f1 = _f1_stats(g, p, k)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, n, size=(BOOTSTRAP_ITERS, n)) if n else np.zeros((BOOTSTRAP_ITERS, 0), dtype=np.int64)
    _, _, f1_boot = _f1_stats(g[idx], p[idx], k)
    out = {"acc": mean_metric(correct)}
    out["macro_f1"] = metric(f1.mean(), f1_boot.mean(-1).std(ddof=1), n)
    out["micro_f1"] = metric(correct.mean() if n else float("nan"), mean_stderr(correct), n)
    for c, name in enumerate(labels):
        as_pred, as_true = p == c, g == c
        out[f"precision/{name}"] = metric(prec[c], mean_stderr(correct[as_pred]), int(as_pred.sum()))
        out[f"recall/{name}"] = metric(rec[c], mean_stderr(correct[as_true]), int(as_true.sum()))
        out[f"f1/{name}"] = metric(f1[c], f1_boot[:, c].std(ddof=1), n)
    matrix = np.zeros((k, k), dtype=np.int64)
    np.add.at(matrix, (g, p), 1)
    return {"metrics": out, "confusion_matrix": {"labels": list(labels), "matrix": matrix.tolist()}}


def squad_normalize(text: str) -> str:
    """SQuAD v1.1 normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, answers: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals a normalised answer, else 0.0."""
    p = squad_normalize(prediction)
    return float(any(p == squad_normalize(a) for a in answers))


def token_f1(prediction: str, answers: Sequence[str]) -> float:
    """Best SQuAD token F1 of `prediction` against `answers` (bag of normalised tokens)."""
    best = 0.0
    p = squad_normalize(prediction).split()
    for a in answers:
        t = squad_normalize(a).split()
        if not p or not t:
            best = max(best, float(p == t))
            continue
        common = sum((collections.Counter(p) & collections.Counter(t)).values())
        if common:
            precision, recall = common / len(p), common / len(t)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def centered_aggregate(scores: dict[str, tuple[dict, float]]) -> dict:
    """DCLM CORE: mean over tasks of (acc - chance) / (1 - chance).

    scores: {task: (`metric` record of its accuracy, chance accuracy in [0, 1))}. The stderr
    treats tasks as independent: sqrt(sum(se_t^2 / (1 - c_t)^2)) / T; n is the example total.
    """
    if not scores:
        raise ValueError("centered_aggregate needs at least one task")
    vals, var, n = [], 0.0, 0
    for rec, chance in scores.values():
        vals.append((rec["value"] - chance) / (1 - chance))
        var += (rec["stderr"] or 0.0) ** 2 / (1 - chance) ** 2
        n += rec["n"]
    return metric(float(np.mean(vals)), math.sqrt(var) / len(vals), n)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem (Chen et al. 2021, eq. 1): the probability that at least one
    of k samples drawn without replacement from n generated samples, c of them correct, is correct,
    1 - C(n - c, k) / C(n, k), computed as 1 - prod_{i = n - c + 1}^{n} (1 - k / i) (no large
    binomials). 1.0 when n - c < k.

    Raises:
        ValueError: not 0 <= c <= n, or not 1 <= k <= n.
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c={c} correct samples must be between 0 and n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k={k} must be between 1 and the n={n} samples")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))
