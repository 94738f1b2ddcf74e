"""Scaling-law fit (gptforge.plan.fit): parameter recovery, refusals, warnings, bad input."""

import json
import math

import numpy as np
import pytest
import yaml

from gptforge.errors import InputError
from gptforge.plan.fit import (
    EXTRAPOLATION_FACTOR,
    RunPoint,
    find_runs,
    fit_scaling_law,
    non_embedding_params,
    predict_loss,
)

TRUE = {"E": 1.7, "A": 40.0, "alpha": 0.34, "B": 40.0, "beta": 0.28}


def synthetic_runs(noise=0.003, seed=0, sizes=(1e5, 3e5, 1e6, 3e6), tokens=(2e6, 6e6, 2e7, 6e7)):
    rng = np.random.default_rng(seed)
    out = []
    for n in sizes:
        for d in tokens:
            loss = float(predict_loss(TRUE, n, d)) * math.exp(rng.normal(0, noise))
            out.append(RunPoint(name=f"n{n:g}_d{d:g}", n_params=n, tokens=d, loss=loss, tokenizer="t", data="x"))
    return out


def test_fit_recovers_synthetic_law_with_noise():
    fit = fit_scaling_law(synthetic_runs(), bootstrap=20)
    p = fit.params
    assert abs(p["E"] - TRUE["E"]) / TRUE["E"] < 0.1
    assert abs(p["alpha"] - TRUE["alpha"]) < 0.08 and abs(p["beta"] - TRUE["beta"]) < 0.08
    # Prediction 2x N and 2x D beyond the grid (4x compute): close, inside the band, no warning.
    n, d = 6e6, 1.2e8
    q = fit.loss(n, d)
    truth = float(predict_loss(TRUE, n, d))
    assert abs(q["loss"] - truth) / truth < 0.01
    assert q["loss_low"] <= q["loss"] <= q["loss_high"]
    assert q["loss_low"] - 0.01 <= truth <= q["loss_high"] + 0.01
    assert q["warnings"] == []


def test_compute_optimal_matches_brute_force_and_tokens_for_loss_inverts():
    fit = fit_scaling_law(synthetic_runs(noise=0.0), bootstrap=5)
    c = 1e15
    opt = fit.compute_optimal(c)
    ns = np.logspace(3, 10, 20000)
    brute = ns[np.argmin(predict_loss(fit.params, ns, c / 6 / ns))]
    assert abs(math.log(opt["n_params"] / brute)) < 0.01
    assert opt["n_params"] * opt["tokens"] * 6 == pytest.approx(c)
    target = float(predict_loss(fit.params, 1e6, 5e7))
    t = fit.tokens_for_loss(target, 1e6)
    assert t["reachable"] and t["tokens"] == pytest.approx(5e7, rel=1e-6)
    m = fit.min_compute_for_loss(target)
    assert m["reachable"] and m["flops"] <= 6 * 1e6 * 5e7 * (1 + 1e-6)
    assert m["loss"] == pytest.approx(target, rel=1e-6)


def test_unreachable_targets_say_so():
    fit = fit_scaling_law(synthetic_runs(noise=0.0), bootstrap=0)
    below_e = fit.tokens_for_loss(fit.params["E"] * 0.95, 1e6)
    assert below_e["tokens"] is None and not below_e["reachable"] and "irreducible" in below_e["reason"]
    assert not fit.min_compute_for_loss(fit.params["E"] * 0.95)["reachable"]
    floor = fit.params["E"] + fit.params["A"] / 1e5 ** fit.params["alpha"]
    small = fit.tokens_for_loss((fit.params["E"] + floor) / 2, 1e5)
    assert small["tokens"] is None and "larger model" in small["reason"]


def test_refuses_fewer_runs_than_parameters_and_one_size():
    runs = synthetic_runs()
    with pytest.raises(InputError, match="at least 5 finished runs"):
        fit_scaling_law(runs[:4])
    one_size = [r for r in runs if r.n_params == 1e5] + [RunPoint("x", 1e5, 9e6, 3.0)]
    with pytest.raises(InputError, match="2 model sizes"):
        fit_scaling_law(one_size)


def test_extrapolation_warning_beyond_factor():
    fit = fit_scaling_law(synthetic_runs(), bootstrap=0)
    s = fit.seen()
    assert fit.extrapolation_warnings(n=s["n_max"] * 2, d=s["d_max"] * 2, c=s["c_max"] * 4) == []
    w = fit.loss(s["n_max"] * 10, s["d_max"])["warnings"]
    assert len(w) == 2 and "largest the fit saw" in w[0]  # N and compute both beyond the factor
    assert EXTRAPOLATION_FACTOR >= 4


def test_different_tokenizers_or_data_refused():
    runs = synthetic_runs()
    runs[3].tokenizer = "other"
    with pytest.raises(InputError, match="different tokenizers"):
        fit_scaling_law(runs)
    runs = synthetic_runs()
    runs[0].data = "other"
    with pytest.raises(InputError, match="different data"):
        fit_scaling_law(runs)


def test_excluded_runs_are_listed_and_not_used():
    runs = synthetic_runs()
    runs[0].status = "diverged"
    runs[1].status = "stopped early (early_stopping)"
    runs[0].loss = 50.0  # would wreck the fit if used
    fit = fit_scaling_law(runs, bootstrap=0)
    assert [r.name for r in fit.excluded] == [runs[0].name, runs[1].name]
    assert len(fit.runs) == len(runs) - 2
    assert abs(fit.params["E"] - TRUE["E"]) / TRUE["E"] < 0.1
    with pytest.raises(InputError, match="excluded"):
        fit_scaling_law(runs[:6])


def _write_run(path, n_layer, loss, max_steps=10, last_step=10, tok="tok1", vals=None):
    path.mkdir(parents=True)
    cfg = {"model": {"n_layer": n_layer, "d_model": 32, "n_head": 2, "block_size": 32, "vocab_size": 384},
           "train": {"max_steps": max_steps}, "data": {"tokenizer_sha256": tok, "meta_sha256": "m"}}
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    rows = [{"step": s, "loss": 5.0 - s * 0.1, "tokens_seen": s * 1000} for s in range(1, last_step + 1)]
    for v, r in zip(vals or [], rows[::-1], strict=False):
        r["val_loss"] = v
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if last_step == max_steps and vals is None:
        (path / "final_eval.json").write_text(json.dumps({"val_loss": loss, "tokens": last_step * 1000,
                                                          "step": last_step, "stopped": "max_steps"}))


def test_read_runs_from_disk_flags_diverged_and_early_stopped(tmp_path):
    _write_run(tmp_path / "sweep" / "a", 2, 3.0)
    _write_run(tmp_path / "sweep" / "b", 2, 3.0, last_step=6, vals=[3.5])
    _write_run(tmp_path / "sweep" / "c", 2, 3.0, vals=[float("nan")])
    (tmp_path / "sweep" / "not_started").mkdir()
    _write_run(tmp_path / "single", 4, 2.5)
    runs = find_runs([tmp_path / "sweep", tmp_path / "single"])
    status = {r.name.split("/")[-1]: r.status for r in runs}
    assert status == {"a": "finished", "b": "stopped early (step 6 of 10)", "c": "diverged", "single": "finished"}
    by = {r.name.split("/")[-1]: r for r in runs}
    assert by["a"].tokens == 10_000 and by["a"].loss == 3.0
    from gptforge.config import ModelConfig
    from gptforge.plan.params import block_param_count

    block = block_param_count(ModelConfig(n_layer=2, d_model=32, n_head=2, block_size=32, vocab_size=384).resolved())
    assert by["single"].n_params - by["a"].n_params == 2 * block  # 4 layers vs 2, embeddings not counted


def test_non_embedding_params_drop_embedding_tables():
    from gptforge.config import ModelConfig
    from gptforge.plan.params import param_count

    cfg = ModelConfig(n_layer=2, d_model=32, n_head=2, block_size=32, vocab_size=384).resolved()
    assert non_embedding_params(cfg) == param_count(cfg) - 384 * 32 - 32 * 32


def test_plot_png_and_plotly_html_without_matplotlib(tmp_path, monkeypatch):
    import sys

    from gptforge.plan.fit import plot_fit

    fit = fit_scaling_law(synthetic_runs(noise=0.0), bootstrap=0)
    png = plot_fit(fit, tmp_path / "fit.png", fit.loss(6e6, 1.2e8))
    assert png.read_bytes()[:4] == b"\x89PNG"
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    html = plot_fit(fit, tmp_path / "fit2.png")
    assert html.suffix == ".html" and "compute-optimal frontier" in html.read_text()
