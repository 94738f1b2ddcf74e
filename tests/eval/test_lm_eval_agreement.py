"""gptforge's acc / acc_norm equal lm-evaluation-harness 0.4's on the same model and task file.

lm-eval runs its own scorer through its `hf` backend on the model exported to a Hugging Face
folder (`gptforge.runtime.loading.to_hf`), zero-shot, offline; gptforge scores the run directly.
"""

import importlib.util
import json

import pytest

from tests.eval.conftest import write_mc_task

pytestmark = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm_eval is not installed")

LM_EVAL_TASK = """task: gptforge_agreement
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
target_delimiter: " "
metric_list:
  - metric: acc
  - metric: acc_norm
"""


def test_acc_and_acc_norm_equal_lm_eval_hf_backend(trained_run, loaded, tmp_path, monkeypatch):
    for k, v in {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                 "HF_DATASETS_CACHE": str(tmp_path / "hf_cache"), "TOKENIZERS_PARALLELISM": "false"}.items():
        monkeypatch.setenv(k, v)
    from gptforge.eval.runner import run_task
    from gptforge.runtime.loading import to_hf

    task_file = write_mc_task(tmp_path / "task.jsonl", n=24)
    model, tok = loaded
    ours = run_task(model, tok, task_file, batch_size=8)

    hf_dir = to_hf(trained_run, tmp_path / "hf")
    include = tmp_path / "lm_eval_tasks"
    include.mkdir()
    (include / "gptforge_agreement.yaml").write_text(LM_EVAL_TASK.format(data=json.dumps(str(task_file))))
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    out = simple_evaluate(model="hf", model_args=f"pretrained={hf_dir},dtype=float32,device=cpu",
                          tasks=["gptforge_agreement"], num_fewshot=0, batch_size=4,
                          task_manager=TaskManager(include_path=str(include), include_defaults=False),
                          log_samples=True)
    theirs = out["results"]["gptforge_agreement"]
    assert ours.n == 24
    assert ours.metrics["acc"]["value"] == pytest.approx(theirs["acc,none"], abs=1e-12)
    assert ours.metrics["acc_norm"]["value"] == pytest.approx(theirs["acc_norm,none"], abs=1e-12)
    assert ours.metrics["acc"]["stderr"] == pytest.approx(theirs["acc_stderr,none"], rel=1e-9)
    # Not a vacuous agreement: the per-choice log-likelihoods match, and no example is a near-tie.
    samples = sorted(out["samples"]["gptforge_agreement"], key=lambda s: s["doc_id"])
    for pred, s in zip(ours.predictions, samples, strict=True):
        lm = [float(r[0]) for r in s["filtered_resps"]]
        assert pred["loglikelihoods"] == pytest.approx(lm, abs=1e-4)
        top = sorted(lm, reverse=True)
        assert top[0] - top[1] > 1e-3


def test_harness_adapter_runs_lm_eval_tasks_on_a_gptforge_model(trained_run, loaded, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    from gptforge.errors import InputError, MissingInputError
    from gptforge.eval.harness import run_harness
    from gptforge.eval.runner import run_task

    model, tok = loaded
    task_file = write_mc_task(tmp_path / "task.jsonl", n=12, seed=3)
    include = tmp_path / "defs"
    include.mkdir()
    (include / "gptforge_agreement.yaml").write_text(LM_EVAL_TASK.format(data=json.dumps(str(task_file))))
    out = run_harness(model, tok, ["gptforge_agreement"], include_path=str(include), batch_size=4)
    ours = run_task(model, tok, task_file)
    assert out["results"]["gptforge_agreement"]["acc,none"] == ours.metrics["acc"]["value"]
    assert out["results"]["gptforge_agreement"]["acc_norm,none"] == ours.metrics["acc_norm"]["value"]

    from gptforge.cli import main

    res = tmp_path / "harness.json"
    assert main(["evaluate", str(trained_run), "--harness", "gptforge_agreement", "--include-path", str(include),
                 "--out", str(res)]) == 0
    assert "acc_norm" in capsys.readouterr().out
    assert json.loads(res.read_text())["results"]["gptforge_agreement"]["acc,none"] == ours.metrics["acc"]["value"]

    with pytest.raises(InputError, match="knows no task 'no_such_task'.*--include-path"):
        run_harness(model, tok, ["no_such_task"], include_path=str(include), include_defaults=False)
    missing = tmp_path / "missing_defs"
    missing.mkdir()
    (missing / "gone.yaml").write_text(LM_EVAL_TASK.replace("gptforge_agreement", "gone_task").format(
        data=json.dumps(str(tmp_path / "absent.jsonl"))))
    with pytest.raises(MissingInputError, match="gone_task.*cannot be loaded offline.*--include-path"):
        run_harness(model, tok, ["gone_task"], include_path=str(missing))
