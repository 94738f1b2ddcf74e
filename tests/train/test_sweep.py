"""Scaling sweeps (gptforge.train.workflows.sweep, `gptforge sweep`): budget planning, runs, resume, val loss."""

import json

import pytest

from gptforge.errors import InputError
from gptforge.plan.fit import RESULT_FILE, read_run
from gptforge.train.workflows.sweep import load_or_write_plan, plan_sweep, run_sweep

TINY = dict(sizes=["2x16", "2x32"], block_size=32, micro_batch_size=4, device="cpu")


def test_plan_fills_budget_with_token_ladder(tiny_shards):
    plan = plan_sweep(tiny_shards, budget_seconds=60, **TINY)
    assert len(plan.runs) == 6 and plan.est_seconds <= 60
    by_size = {}
    for r in plan.runs:
        by_size.setdefault(r.d_model, []).append(r.tokens)
    for toks in by_size.values():
        toks.sort()
        assert toks[1] == 2 * toks[0] and toks[2] == 4 * toks[0]
    assert set(plan.step_seconds) == {"2x16", "2x32"} and all(v > 0 for v in plan.step_seconds.values())
    with pytest.raises(InputError, match="too small"):
        plan_sweep(tiny_shards, budget_seconds=1, **TINY)
    with pytest.raises(InputError, match="LAYERSxD_MODEL"):
        plan_sweep(tiny_shards, budget_seconds=60, **{**TINY, "sizes": ["2x16", "big"]})


def test_sweep_runs_records_every_val_token_and_resumes(tiny_shards, tmp_path):
    out = tmp_path / "sweep"
    plan = plan_sweep(tiny_shards, budget_seconds=60, tokens=[1280, 2560, 3840], **TINY)
    assert len(plan.runs) == 6 and sorted(r.tokens for r in plan.runs) == [1280, 1280, 2560, 2560, 3840, 3840]
    with pytest.raises(InputError, match="a fit needs 5"):
        plan_sweep(tiny_shards, budget_seconds=60, tokens=[1280, 2560], **TINY)
    by_name = {r.name: r for r in plan.runs}
    plan.runs = [by_name["l2_d16_t1280"], by_name["l2_d32_t1280"], by_name["l2_d16_t2560"]]
    first = plan.runs[:2]
    done = run_sweep(type(plan)(**{**plan.__dict__, "runs": first}), tiny_shards, out)
    assert done["finished"] == [r.name for r in first] and done["stopped"] is None
    meta = json.loads((tiny_shards / "meta.json").read_text())
    ev = json.loads((out / first[0].name / RESULT_FILE).read_text())
    assert ev["val_tokens"] == meta["splits"]["val"]["tokens"] - 1  # every val target once
    assert ev["tokens"] == first[0].tokens and ev["stopped"] == "max_steps" and 0 < ev["val_loss"] < 7
    # A "killed" sweep: run 2 lost its result after training, run 3 died before its first checkpoint.
    untouched = (out / first[0].name / "metrics.jsonl").stat().st_mtime_ns
    trained = (out / first[1].name / "metrics.jsonl").read_text()
    (out / first[1].name / RESULT_FILE).unlink()
    (out / plan.runs[2].name).mkdir()
    (out / plan.runs[2].name / "config.yaml").write_text("partial")
    done = run_sweep(plan, tiny_shards, out)
    assert done["finished"] == [r.name for r in plan.runs]
    assert (out / first[0].name / "metrics.jsonl").stat().st_mtime_ns == untouched
    assert (out / first[1].name / "metrics.jsonl").read_text() == trained  # resumed at max_steps: no new steps
    point = read_run(out / plan.runs[2].name)
    assert point.status == "finished" and point.tokens == plan.runs[2].tokens


def test_saved_plan_must_match_options(tmp_path):
    from gptforge.train.workflows.sweep import SweepPlan, SweepRun

    plan = SweepPlan(runs=[SweepRun("a", 2, 16, 1280, 10, 1.0)], options={"lr": 1e-3, "seed": 1}, step_seconds={},
                     val_tokens=10, budget_seconds=60, est_seconds=1.0)
    got, resumed = load_or_write_plan(tmp_path, lambda: plan, {"lr": 1e-3, "seed": 1})
    assert not resumed and (tmp_path / "sweep.json").is_file()
    got, resumed = load_or_write_plan(tmp_path, lambda: 1 / 0, {"lr": 1e-3, "seed": 1})
    assert resumed and got.runs[0].name == "a"
    with pytest.raises(InputError, match="other options"):
        load_or_write_plan(tmp_path, lambda: plan, {"lr": 2e-3, "seed": 1})


def test_sweep_command_plan_only(tiny_shards, tmp_path, capsys):
    from gptforge.cli import main

    out = tmp_path / "s"
    rc = main(["sweep", "--data", str(tiny_shards), "--out", str(out), "--budget-minutes", "1", "--sizes", "2x16",
               "2x32", "--block-size", "32", "--micro-batch-size", "4", "--device", "cpu", "--plan-only"])
    text = capsys.readouterr().out
    assert rc == 0 and "planned sweep" in text and "l2_d32_t" in text
    assert len(json.loads((out / "sweep.json").read_text())["plan"]["runs"]) == 6
    rc = main(["sweep", "--data", str(tiny_shards), "--out", str(out), "--budget-minutes", "2", "--sizes", "2x16",
               "2x32", "--block-size", "32", "--micro-batch-size", "4", "--device", "cpu", "--plan-only"])
    assert rc != 0 and "other options" in capsys.readouterr().err


def test_diverged_run_is_recorded_and_excluded_from_the_fit(tiny_shards, tmp_path, monkeypatch):
    import gptforge.train.run as loop
    from gptforge.errors import TrainingError
    from gptforge.plan.fit import find_runs
    from gptforge.train.workflows.sweep import SweepPlan, SweepRun, model_config, train_config

    opts = {"block_size": 32, "micro_batch_size": 4, "lr": 2e-3, "seed": 1, "device": "cpu"}
    plan = SweepPlan(runs=[SweepRun("l2_d16_t1280", 2, 16, 1280, 10, 1.0)], options=opts, step_seconds={},
                     val_tokens=10, budget_seconds=60, est_seconds=1.0)
    real_train = loop.train

    def diverging(cfg, data_dir, run_dir, **kw):  # the real trainer writes the run, then the loss blows up
        real_train(cfg, data_dir, run_dir, **kw)
        raise TrainingError("5 consecutive non-finite steps")

    monkeypatch.setattr(loop, "train", diverging)
    assert train_config(10, opts).max_steps == 10 and model_config(2, 16, 32, 384).n_head == 1
    done = run_sweep(plan, tiny_shards, tmp_path)
    assert done["finished"] == []
    (point,) = find_runs([tmp_path])
    assert point.status == "diverged"
