import json
import math
import re
import shutil

import numpy as np
import pytest

from gptforge.cli import main as cli_main
from gptforge.report import write_report, write_run_report
from gptforge.report.downsample import minmax_downsample
from gptforge.report.page import config_diff, summarize
from gptforge.report.run_data import load_run, read_metrics_file
from gptforge.train.loggers import read_metrics
from tests.report.conftest import write_rows


def _summary(page: str) -> list[dict]:
    m = re.search(r"<script type='application/json' id=summary-json>(.*?)</script>", page, re.S)
    return json.loads(m.group(1))


def test_minmax_downsample_keeps_every_extreme():
    rng = np.random.default_rng(0)
    y = np.cumsum(rng.normal(size=20_000))
    y[12_345] = 1e3  # a one-step spike
    y[777] = -1e3
    x = np.arange(1, y.size + 1)
    dx, dy = minmax_downsample(x, y, 1000)
    assert len(dx) <= 1000 and np.all(np.diff(dx) > 0)
    assert 1e3 in dy and -1e3 in dy and dx[0] == 1 and dx[-1] == 20_000
    # Every point kept is a real point of the curve.
    assert np.array_equal(y[(dx - 1).astype(int)], dy)
    # Each of the 250 buckets keeps its min and max.
    for b in np.array_split(np.arange(y.size), 250)[:20]:
        assert y[b].max() in dy and y[b].min() in dy
    sx, sy = minmax_downsample([1, 2, 3], [3.0, 1.0, 2.0], 1000)
    assert list(sy) == [3.0, 1.0, 2.0]
    with pytest.raises(ValueError):
        minmax_downsample([1, 2], [1.0], 10)


def test_report_of_a_real_run_matches_its_metrics(real_run):
    out = write_run_report(real_run)
    assert out == real_run / "report.html"
    page = out.read_text()
    from plotly.offline import get_plotlyjs

    bundle = get_plotlyjs()
    assert page.count(bundle) == 1  # plotly.js inline, once
    rest = page.replace(bundle, "")
    assert not re.search(r"(src|href)=['\"]?(https?:)?//", rest)  # nothing fetched or linked off the machine
    assert page.count("Plotly.newPlot(") >= 7
    rows = read_metrics(real_run)
    s = _summary(page)[0]
    assert s["steps"] == 12 == rows[-1]["step"]
    assert s["final_train_loss"] == rows[-1]["loss"]
    assert s["tokens_seen"] == rows[-1]["tokens_seen"]
    vals = [r["val_loss"] for r in rows if "val_loss" in r]
    assert len(vals) == 3 and s["best_val_loss"] == min(vals) and s["final_val_loss"] == vals[-1]
    assert math.isclose(s["val_perplexity"], math.exp(vals[-1]))
    assert s["val_bits_per_byte"] is not None and 0 < s["val_bits_per_byte"] < 20
    assert s["stopped"] == "reached train.max_steps (12)"
    assert load_run(real_run).resumes == [7]  # stopped at 6, resumed with step 7
    assert s["parameters"] > 0
    # The data section links the prepare report by a relative path that exists.
    href = re.search(r"<a href='([^']+)'>prepare report</a>", page).group(1)
    assert (real_run / href).resolve().is_file()


def test_trainer_stop_reason_is_shown(real_run, tmp_path):
    run = tmp_path / "copy"
    shutil.copytree(real_run, run)
    page = write_run_report(run, stopped="early_stopping").read_text()
    assert _summary(page)[0]["stopped"] == "early_stopping"


def test_missing_metrics_says_so_and_renders_the_rest(real_run, tmp_path):
    run = tmp_path / "nometrics"
    run.mkdir()
    shutil.copy(real_run / "config.yaml", run / "config.yaml")
    page = write_run_report(run).read_text()
    assert "metrics.jsonl is missing" in page
    assert "no data: no run logged <code>loss</code>" in page
    s = _summary(page)[0]
    assert s["steps"] is None and s["parameters"] > 0 and s["stopped"] == "no step was logged"
    only_eval = tmp_path / "only_eval"
    (only_eval / "eval").mkdir(parents=True)
    page = write_run_report(only_eval).read_text()
    assert "config.yaml is missing" in page and "metrics.jsonl is missing" in page


def test_an_empty_folder_is_refused_with_one_error_line(tmp_path, capsys):
    from gptforge.cli import main as cli_main

    empty = tmp_path / "emptyrun"
    empty.mkdir()
    assert cli_main(["report", str(empty), "--quiet"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gptforge report: error:")
    assert str(empty) in err[0] and "metrics.jsonl" in err[0] and "config.yaml" in err[0]
    assert not (empty / "report.html").exists()


def test_predictions_files_are_not_shown_as_evaluation_results(real_run, tmp_path):
    import json

    run = tmp_path / "withpreds"
    shutil.copytree(real_run, run)
    (run / "eval").mkdir(exist_ok=True)
    (run / "eval" / "results.json").write_text(json.dumps({"mc": {"acc": 0.5}}))
    (run / "eval" / "results.predictions.json").write_text(json.dumps({"mc": [{"pred": 1}]}))
    page = write_run_report(run).read_text()
    assert "results.json" in page and "results.predictions.json" not in page


def test_half_written_last_line_is_skipped_and_counted(real_run, tmp_path):
    run = tmp_path / "cut"
    shutil.copytree(real_run, run)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 13, "loss": 4.1, "lr"')  # a kill mid-write
    mf = read_metrics_file(run / "metrics.jsonl")
    assert mf.bad_lines == 1 and mf.last_line_cut and mf.rows[-1]["step"] == 12
    page = write_run_report(run).read_text()
    assert "1 unreadable line(s)" in page and "the last line was cut" in page
    assert _summary(page)[0]["steps"] == 12


def test_runs_with_different_metric_sets_overlay(real_run, tmp_path):
    cfg = (real_run / "config.yaml").read_text().replace("lr: 0.003", "lr: 0.001")
    rows = [{"step": s, "loss": 6.0 - 0.1 * s, "lr": 1e-3, "eval_hellaswag": 0.25 + 0.01 * s,
             **({"events": [{"kind": "spike", "metric": "loss", "value": 9.0, "advice": "lower lr"}]} if s == 3 else {}),
             **({"skipped": True, "loss": None} if s == 5 else {})} for s in range(1, 9)]
    other = write_rows(tmp_path / "b" / "nano", rows, cfg)  # same folder name: labels get the parent
    out = write_report([real_run, other], tmp_path / "ab.html")
    page = out.read_text()
    assert "id=config-diff" in page and "<code>train.lr</code>" in page
    diff = dict(config_diff([load_run(real_run), load_run(other)]))
    assert diff["train.lr"] == [0.003, 0.001]
    assert "b\\u002fnano: train loss" in page  # plotly escapes "/" in its JSON
    assert "chart-other" in page and "eval_hellaswag" in page  # the extra key gets a chart
    assert "skipped step (non-finite)" in page and "lower lr" in page
    s = _summary(page)
    assert s[1]["steps"] == 8 and s[1]["skipped_steps"] == 1 and s[1]["final_train_loss"] == 6.0 - 0.8
    assert s[1]["tokens_seen"] is None and s[0]["tokens_seen"] is not None


def test_eval_results_are_tabled(real_run, tmp_path):
    run = tmp_path / "ev"
    shutil.copytree(real_run, run)
    (run / "eval").mkdir()
    (run / "eval" / "results.json").write_text(json.dumps({"results": {"hellaswag": {"acc": 0.3125}}}))
    (run / "eval" / "broken.json").write_text("{not json")
    page = write_run_report(run).read_text()
    assert "results.hellaswag.acc" in page and "0.3125" in page
    assert "broken.json is not valid JSON" in page


def test_summary_of_rows_alone():
    from gptforge.report.run_data import RunData

    run = RunData(path=__import__("pathlib").Path("."), label="x",
                  config={"train": {"max_steps": 10, "max_bad_steps": 2}},
                  rows=[{"step": 1, "loss": 3.0}, {"step": 2, "loss": None, "skipped": True},
                        {"step": 3, "loss": None, "skipped": True}])
    s = summarize(run)
    assert s["final_train_loss"] == 3.0 and s["skipped_steps"] == 2
    assert "2 consecutive non-finite steps" in s["stopped"]


def test_cli_report(real_run, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert cli_main(["report", str(real_run), "--out", str(out)]) == 0
    assert out.stat().st_size > 1_000_000 and "wrote" in capsys.readouterr().out
    assert cli_main(["report", str(tmp_path / "nope")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gptforge report: error:") and "nope" in err


def test_rl_run_charts_reward_and_heldout_pass_at_1(real_run, tmp_path):
    """gptforge rl's rows: a Reward chart with the training reward per step and held-out pass@1 at
    the evaluations (kept out of the catch-all chart); a run without them has no Reward chart."""
    from gptforge.report.charts import other_metrics_chart, reward_chart

    rows = [{"step": s, "loss": 0.01 * s, "rl/reward_mean": 0.1 * s, "rl/entropy": 2.0,
             **({"eval/pass@1": 0.2 * s, "val_loss": -0.2 * s} if s % 2 == 0 else {})} for s in range(1, 7)]
    run = write_rows(tmp_path / "rl", rows)
    data = load_run(run)
    fig = reward_chart([data])
    by_name = {t.name: t for t in fig.data}
    assert list(by_name["train reward"].y) == pytest.approx([0.1 * s for s in range(1, 7)])
    assert list(by_name["held-out pass@1"].x) == [2, 4, 6]
    assert list(by_name["held-out pass@1"].y) == pytest.approx([0.4, 0.8, 1.2])
    assert {t.name for t in other_metrics_chart([data]).data} == {"rl/entropy"}
    page = write_run_report(run).read_text()
    assert "<h2>Reward</h2>" in page and "chart-reward" in page
    assert reward_chart([load_run(real_run)]) is None
    assert "chart-reward" not in write_report([real_run], tmp_path / "plain.html").read_text()
