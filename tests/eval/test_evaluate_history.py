"""`gptforge evaluate` keeps earlier calls' results (merged results.json + results.history.jsonl),
the run report reads them, and evaluate shows progress lines on a non-terminal stderr (none with --quiet)."""

from __future__ import annotations

import json
import re

import pytest

from gptforge.cli import main
from gptforge.errors import DamagedFileError
from gptforge.eval.results_file import merge_results, record_results
from tests.eval.conftest import write_mc_task


def test_a_second_evaluate_keeps_the_first_calls_tasks(trained_run, tmp_path, capsys):
    a = write_mc_task(tmp_path / "alpha.jsonl", n=6, seed=1)
    b = write_mc_task(tmp_path / "beta.jsonl", n=6, seed=2)
    out = trained_run / "eval" / "history_test" / "results.json"
    assert main(["evaluate", str(trained_run), "--tasks", str(a), "--out", str(out), "--quiet"]) == 0
    first = json.loads(out.read_text())
    assert main(["evaluate", str(trained_run), "--tasks", str(b), "--out", str(out), "--quiet",
                 "--num-fewshot", "1"]) == 0
    assert "also holds earlier results of alpha" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert set(doc["tasks"]) == {"alpha", "beta"}
    assert doc["tasks"]["alpha"]["metrics"] == first["tasks"]["alpha"]["metrics"]
    assert doc["tasks"]["alpha"]["num_fewshot"] == 0 and doc["tasks"]["beta"]["num_fewshot"] == 1
    for t in doc["tasks"].values():
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", t["evaluated_at"])
        assert t["checkpoint"] == doc["checkpoint"] and len(t["checkpoint_sha256"]) == 64
    assert doc["num_fewshot"] == 1  # the top level describes the latest call
    preds = json.loads((out.parent / "results.predictions.json").read_text())
    assert set(preds) == {"alpha", "beta"}
    history = [json.loads(line) for line in (out.parent / "results.history.jsonl").read_text().splitlines()]
    assert [sorted(h["tasks"]) for h in history] == [["alpha"], ["beta"]]

    # the run report reads eval/**/*.json: the merged file, both tasks, and not the .jsonl history
    from gptforge.report.run_data import load_run

    run = load_run(trained_run)
    files = dict(run.eval_results)
    assert set(files["eval/history_test/results.json"]["tasks"]) == {"alpha", "beta"}
    assert not any(rel.endswith(".jsonl") for rel in files)


def test_merge_replaces_a_task_evaluated_again_and_stamps_old_entries():
    old = {"checkpoint": "c1", "checkpoint_sha256": "s1", "tasks": {"a": {"n": 1}, "b": {"n": 2}}}
    new = {"checkpoint": "c2", "checkpoint_sha256": "s2", "tasks": {"b": {"n": 3}}}
    m = merge_results(old, new, "2026-01-01T00:00:00Z")
    assert m["tasks"]["b"] == {"n": 3, "evaluated_at": "2026-01-01T00:00:00Z", "checkpoint": "c2",
                               "checkpoint_sha256": "s2"}
    assert m["tasks"]["a"] == {"n": 1, "evaluated_at": None, "checkpoint": "c1", "checkpoint_sha256": "s1"}
    assert m["checkpoint"] == "c2" and m["evaluated_at"] == "2026-01-01T00:00:00Z"


def test_a_damaged_results_file_is_refused_not_overwritten(tmp_path):
    path = tmp_path / "results.json"
    path.write_text("{not json")
    with pytest.raises(DamagedFileError, match="results.json: not valid JSON"):
        record_results(path, {"tasks": {}})
    assert path.read_text() == "{not json"


def test_evaluate_and_contamination_print_progress_lines_unless_quiet(trained_run, tiny_shards, tmp_path, capsys):
    task = write_mc_task(tmp_path / "mc.jsonl", n=8)
    args = ["evaluate", str(trained_run), "--tasks", str(task), "--contamination", str(tiny_shards),
            "--out", str(tmp_path / "r.json")]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert re.search(r"gptforge: scoring mc: 0/\d+ requests \(0%\).*started", err)
    assert re.search(r"gptforge: scoring mc: (\d+)/\1 requests \(100%\).*done", err)
    assert re.search(r"gptforge: contamination check: [\d,]+/[\d,]+ train tokens \(100%\).*done", err)
    assert main(args + ["--quiet"]) == 0
    assert "gptforge:" not in capsys.readouterr().err
