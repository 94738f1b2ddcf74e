"""`gptforge evaluate RUN --tasks ...`: results.json with value, stderr, n per metric; table; errors."""

import json

from gptforge.cli import main
from gptforge.eval.tasks import file_sha256
from tests.eval.conftest import write_mc_task


def test_evaluate_tasks_writes_results_json_and_prints_a_table(trained_run, tmp_path, capsys):
    mc = write_mc_task(tmp_path / "mc.jsonl", n=12)
    cls = tmp_path / "cls.jsonl"
    cls.write_text("".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in
                           [("import os", "code"), ("Hello, friend.", "prose"), ("x = 1", "code"),
                            ("What a day.", "prose")]))
    assert main(["evaluate", str(trained_run), "--tasks", str(mc), str(cls), "--num-fewshot", "1",
                 "--limit", "10", "--batch-size", "5"]) == 0
    out = capsys.readouterr().out
    assert "acc_norm" in out and "macro_f1" in out and "CORE" in out
    doc = json.loads((trained_run / "eval" / "results.json").read_text())
    assert doc["versions"]["gptforge"] and doc["versions"]["torch"]
    assert doc["checkpoint"].endswith("step_0000040") and len(doc["checkpoint_sha256"]) == 64
    assert doc["num_fewshot"] == 1 and doc["seed"] == 1234
    t = doc["tasks"]["mc"]
    assert t["n"] == 10 and t["num_fewshot"] == 1 and t["sha256"] == file_sha256(mc) and t["truncated"] >= 0
    for rec in t["metrics"].values():
        assert set(rec) == {"value", "stderr", "n"} and rec["n"] == 10
    assert doc["tasks"]["cls"]["n"] == 4 and doc["tasks"]["cls"]["confusion_matrix"]["labels"] == ["code", "prose"]
    assert "core" in doc["aggregate"]
    preds = json.loads((trained_run / "eval" / "results.predictions.json").read_text())
    assert len(preds["mc"]) == 10

    custom = tmp_path / "r.json"
    assert main(["evaluate", str(trained_run), "--tasks", str(mc), "--out", str(custom), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tasks"]["mc"]["n"] == 12
    assert json.loads(custom.read_text())["tasks"]["mc"]["num_fewshot"] == 0


def test_evaluate_bad_task_and_bad_options_are_one_line_errors(trained_run, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"context": "x", "choices": ["a", "b"], "label": 5}\n')
    assert main(["evaluate", str(trained_run), "--tasks", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gptforge evaluate: error:") and "bad.jsonl, line 1: field 'label' = 5" in err
    assert main(["evaluate", str(trained_run)]) == 2  # a bad command line: errors.USAGE_EXIT
    assert "exactly one of --tasks" in capsys.readouterr().err


def test_evaluate_a_hugging_face_folder_gives_the_run_s_scores(trained_run, tmp_path, capsys):
    from gptforge.runtime.loading import to_hf

    mc = write_mc_task(tmp_path / "mc.jsonl", n=10, seed=2)
    hf = to_hf(trained_run, tmp_path / "hf")
    assert main(["evaluate", str(hf), "--tasks", str(mc), "--json"]) == 0
    from_hf = json.loads(capsys.readouterr().out)["tasks"]["mc"]["metrics"]
    assert (hf / "eval" / "results.json").is_file()
    assert main(["evaluate", str(trained_run), "--tasks", str(mc), "--json", "--out", str(tmp_path / "r.json")]) == 0
    from_run = json.loads(capsys.readouterr().out)["tasks"]["mc"]["metrics"]
    assert from_hf["acc"]["value"] == from_run["acc"]["value"]
    assert from_hf["acc_norm"]["value"] == from_run["acc_norm"]["value"]
