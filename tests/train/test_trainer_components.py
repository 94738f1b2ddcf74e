"""Components plugged into the Trainer: the run report at the end of every run, spike alarms in
metrics.jsonl, resume marks, and W&B offline with the same run id after a resume."""

from __future__ import annotations

import pytest
import torch

import gptforge.train.objectives.next_token as next_token_lib
from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.errors import TrainingError
from gptforge.runtime import checkpoint as ck
from gptforge.train.loggers import read_metrics
from gptforge.train.run import train


def _cfg(**kw):
    base = dict(max_steps=8, micro_batch_size=2, lr=3e-3, warmup_steps=2, eval_interval=4, eval_steps=1,
                checkpoint_interval=4, tensorboard=False)
    base.update(kw)
    return RunConfig(model=ModelConfig(preset="gpt2-nano", d_model=32, block_size=32), train=TrainConfig(**base))


def test_every_run_ends_with_a_report_also_when_it_fails(tiny_shards, tmp_path, monkeypatch):
    run = tmp_path / "ok"
    train(_cfg(), tiny_shards, run, progress=False)
    html = (run / "report.html").read_text()
    assert "max_steps" in html and "plotly" in html.lower()
    # A run stopped by non-finite losses still gets its report.
    real = next_token_lib.token_loss_sum
    monkeypatch.setattr(next_token_lib, "token_loss_sum", lambda lg, t: real(lg, t) * float("nan"))
    bad = tmp_path / "bad"
    with pytest.raises(TrainingError):
        train(_cfg(max_bad_steps=2), tiny_shards, bad, progress=False)
    assert (bad / "report.html").exists()
    monkeypatch.undo()
    off = tmp_path / "off"
    train(_cfg(report=False), tiny_shards, off, progress=False)
    assert not (off / "report.html").exists()


def test_a_loss_spike_is_an_event_in_metrics_and_a_resume_is_marked(tiny_shards, tmp_path, monkeypatch):
    real = next_token_lib.token_loss_sum
    calls = {"n": 0}

    def spiky(logits, targets):
        calls["n"] += 1
        out = real(logits, targets)
        return out * 3.0 if calls["n"] == 30 else out  # step 30 of 40 (one micro-batch a step)

    monkeypatch.setattr(next_token_lib, "token_loss_sum", spiky)
    run = tmp_path / "run"
    train(_cfg(max_steps=40, lr=1e-3, warmup_steps=0, eval_interval=0, checkpoint_interval=20, stop_at_step=35,
               log_interval=5), tiny_shards, run, progress=False)
    rows = {r["step"]: r for r in read_metrics(run)}
    assert 30 in rows, "a step with an alarm is logged even off log_interval"
    assert any(e["kind"] in ("spike", "divergence") and e["metric"] == "loss" for e in rows[30]["events"])
    assert not any(r.get("events") for s, r in rows.items() if s < 30)
    state = ck.load_trainer_state(ck.find_checkpoint(run))
    assert len(state["spikes"]["history"]["loss"]) == 35
    monkeypatch.undo()
    train(_cfg(max_steps=40, lr=1e-3, warmup_steps=0, eval_interval=0, checkpoint_interval=20, log_interval=5),
          tiny_shards, run, resume=True, progress=False)
    rows = {r["step"]: r for r in read_metrics(run)}
    assert {"kind": "resume", "step": 36} in rows[36]["events"]


def test_wandb_offline_keeps_its_run_id_across_a_resume(tiny_shards, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing may leave the machine
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    kw = dict(wandb_project="gptforge-test", wandb_mode="offline", report=True)
    train(_cfg(stop_at_step=4, **kw), tiny_shards, run, progress=False)
    first = ck.load_trainer_state(ck.find_checkpoint(run))["wandb"]["run_id"]
    assert first and list((run / "wandb").glob(f"offline-run-*-{first}"))
    train(_cfg(**kw), tiny_shards, run, resume=True, progress=False)
    assert ck.load_trainer_state(ck.find_checkpoint(run))["wandb"]["run_id"] == first
    assert len(list((run / "wandb").glob(f"offline-run-*-{first}"))) >= 1
    assert torch.isfinite(torch.tensor([r["loss"] for r in read_metrics(run)])).all()


def _mc_task(path):
    import json

    rows = [{"context": f"def f{i}(x):\n    return", "choices": [" x", " None is not", " 12345 67"], "label": 0}
            for i in range(6)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_task_scores_during_training_and_the_best_checkpoint_by_a_task_metric(tiny_shards, tmp_path):
    task = _mc_task(tmp_path / "mc.jsonl")
    run = tmp_path / "run"
    train(_cfg(eval_tasks=[str(task)], best_metric="eval/mc/acc"), tiny_shards, run, progress=False)
    rows = [r for r in read_metrics(run) if "eval/mc/acc" in r]
    assert [r["step"] for r in rows] == [4, 8]
    assert all(0.0 <= r["eval/mc/acc"] <= 1.0 and "eval/mc/acc_norm" in r for r in rows)
    best = ck.load_trainer_state(ck.find_checkpoint(run, "best"))
    assert best["best_metric"] == "eval/mc/acc"
    assert best["best_metric_value"] == max(r["eval/mc/acc"] for r in rows[: best["step"] // 4])
    with pytest.raises(ValueError, match="train.best_metric"):
        train(_cfg(best_metric="eval/nope/acc"), tiny_shards, tmp_path / "bad", progress=False)


def test_a_second_writer_on_one_run_directory_is_refused(tiny_shards, tmp_path):
    from gptforge.runtime.lock import FolderLock, FolderLockedError

    run = tmp_path / "run"
    with FolderLock(run, command="gptforge pretrain (another one)"):
        with pytest.raises(FolderLockedError, match="another one"):
            train(_cfg(), tiny_shards, run, progress=False)
    assert not (run / "metrics.jsonl").exists()
    train(_cfg(max_steps=2), tiny_shards, run, progress=False)  # free again once the holder is gone
    assert [r["step"] for r in read_metrics(run)][-1] == 2


def test_the_run_ends_with_samples_in_the_report(tiny_shards, tmp_path):
    import json

    run = tmp_path / "run"
    train(_cfg(max_steps=4), tiny_shards, run, progress=False)
    doc = json.loads((run / "samples.json").read_text())
    assert doc["step"] == 4 and {s["mode"] for s in doc["samples"]} == {"greedy", "sampled"}
    assert len(doc["samples"]) == 8 and all(isinstance(s["text"], str) for s in doc["samples"])
    # the prompts are the run's own documents (val, else train), not fixed code-like prompts
    from gptforge.data.loader import document_prefixes
    from gptforge.data.tokenizer import Tokenizer

    split, prefixes = document_prefixes(tiny_shards)
    assert split in ("val", "train") and doc["prompt_source"].startswith(f"first tokens of 3 {split} documents")
    tok = Tokenizer.from_file(run / "tokenizer.json")
    assert [s["prompt"] for s in doc["samples"][::2]] == ["", *(tok.decode(p) for p in prefixes)]
    assert "Prompts: first tokens of" in (run / "report.html").read_text()
    html = (run / "report.html").read_text()
    assert "<h2>Samples</h2>" in html and "at step 4" in html


def test_document_prefixes_are_the_first_tokens_of_documents_or_nothing(tmp_path):
    import json

    import numpy as np

    from gptforge.data.loader import document_prefixes

    assert document_prefixes(tmp_path) == ("", [])  # no meta.json: the trainer falls back to fixed prompts
    ids = np.array([5, 6, 7, 8, 9, 0, 3, 0, 11, 12, 13, 14, 0], dtype="<u2")  # eos 0; doc [3] is too short
    (tmp_path / "train_000.bin").write_bytes(ids.tobytes())
    (tmp_path / "meta.json").write_text(json.dumps({"eos_id": 0, "dtype": "uint16", "splits": {
        "train": {"tokens": len(ids), "files": ["train_000.bin"]}, "val": {"tokens": 0, "files": []}}}))
    assert document_prefixes(tmp_path, n_tokens=3) == ("train", [[5, 6], [11, 12]])
