"""What a new user hit in the first hour: precision auto, a time budget, MFU above 100%, a prompt
second Ctrl-C, and --resume on a run killed before its first checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

import gptforge.runtime.device as device_mod
from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.runtime.device import resolve_precision
from gptforge.train.loggers import read_metrics
from gptforge.train.run import train


def _fake_peaks(monkeypatch, fp32: float, bf16: float):
    monkeypatch.delenv("GPTFORGE_AUTO_PRECISION", raising=False)
    monkeypatch.setattr(device_mod, "_CPU_PEAKS", {})  # forget figures measured (or faked) before
    monkeypatch.setattr(device_mod, "measure_cpu_matmul_peak",
                        lambda dtype=torch.float32, **kw: bf16 if dtype == torch.bfloat16 else fp32)


def test_precision_auto_picks_fp32_where_bf16_is_slower(monkeypatch):
    _fake_peaks(monkeypatch, fp32=17.6e9, bf16=1.2e9)  # the AVX2-only EPYC of the issue
    said = []
    assert resolve_precision("auto", torch.device("cpu"), said.append) == "fp32"
    assert "bf16 1.2 vs fp32 17.6 GFLOP/s" in said[0]
    _fake_peaks(monkeypatch, fp32=17.6e9, bf16=60e9)  # a CPU with AVX-512 BF16 / AMX
    assert resolve_precision("auto", torch.device("cpu")) == "bf16"


def test_explicit_bf16_on_a_slow_bf16_cpu_warns_with_both_figures(monkeypatch):
    _fake_peaks(monkeypatch, fp32=17.6e9, bf16=1.2e9)
    said = []
    assert resolve_precision("bf16", torch.device("cpu"), said.append) == "bf16"
    assert said and "WARNING" in said[0] and "1.2 GFLOP/s" in said[0] and "17.6" in said[0]


def test_auto_is_frozen_in_config_yaml(tiny_shards, tmp_path, monkeypatch):
    _fake_peaks(monkeypatch, fp32=17.6e9, bf16=1.2e9)
    run = tmp_path / "run"
    train(RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32),
                    train=TrainConfig(max_steps=2, micro_batch_size=2, eval_interval=0, tensorboard=False,
                                      report=False)), tiny_shards, run, progress=False)
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["precision"] == "fp32"


def test_a_time_budgeted_run_sets_its_steps_stops_and_resumes(tiny_shards, tmp_path, monkeypatch):
    import gptforge.train.budget as budget

    monkeypatch.setattr(budget, "measure_step_seconds", lambda mc, tc, repeats=3: 5.0)  # 5 s/step
    cfg = RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32),
                    train=TrainConfig(max_minutes=5.0, micro_batch_size=2, eval_interval=0, warmup_steps=2,
                                      tensorboard=False, report=False))
    run = tmp_path / "run"
    said = []
    r = train(cfg, tiny_shards, run, progress=False, log=said.append)
    saved = yaml.safe_load((run / "config.yaml").read_text())["train"]
    assert saved["max_steps"] == saved["max_minutes_steps"] == 60  # 300 s / 5 s (no evaluation share)
    assert any("train.max_steps 60" in m for m in said)
    assert r.step == 60  # the real steps are much faster than 5 s: all planned steps fit
    # A budget used up stops the run with a checkpoint; a resume with a larger budget continues.
    cfg2 = RunConfig(model=cfg.model, train=TrainConfig(max_minutes=1e-7, micro_batch_size=2, eval_interval=0,
                                                        warmup_steps=2, tensorboard=False, report=False))
    run2 = tmp_path / "run2"
    r2 = train(cfg2, tiny_shards, run2, progress=False)
    assert r2.stopped == "max_minutes" and r2.step == 1
    monkeypatch.setattr(budget, "measure_step_seconds", lambda *a, **k: pytest.fail("resume must not re-measure"))
    doc = yaml.safe_load((run2 / "config.yaml").read_text())
    tc = TrainConfig(**{**doc["train"], "max_minutes": 10.0})
    r3 = train(RunConfig(model=cfg.model, train=tc), tiny_shards, run2, resume=True, progress=False)
    assert r3.step == doc["train"]["max_steps"] and [row["step"] for row in read_metrics(run2)][0] == 1


def test_mfu_above_100_percent_is_not_a_number(tiny_shards, tmp_path, monkeypatch):
    import gptforge.train.trainer as trainer_mod
    from gptforge.train.mfu import Peak

    monkeypatch.setattr(trainer_mod, "device_peak", lambda device, precision: Peak(1.0, "a wrong peak"))
    run = tmp_path / "run"
    r = train(RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32),
                        train=TrainConfig(max_steps=2, micro_batch_size=2, eval_interval=0, tensorboard=False,
                                          report=False)), tiny_shards, run, progress=False)
    assert all(row["mfu"] is None for row in r.history)


def test_resume_of_a_run_killed_before_its_first_checkpoint_starts_fresh(tiny_shards, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints" / ".tmp_step_0000005").mkdir(parents=True)  # a half-written first checkpoint
    (run / "metrics.jsonl").write_text("")
    (run / "config.yaml").write_text("model: {preset: gpt2-nano}\n")  # written at start, before any step
    said = []
    cfg = RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32),
                    train=TrainConfig(max_steps=3, micro_batch_size=2, eval_interval=0, tensorboard=False,
                                      report=False))
    r = train(cfg, tiny_shards, run, resume=True, progress=False, log=said.append)
    assert r.step == 3 and any("starting fresh" in m for m in said)


def test_a_second_sigint_exits_at_once(tiny_shards, tmp_path):
    run = tmp_path / "run"
    # Long steps (400 micro-batches each): the first Ctrl-C waits for the step to end, the second
    # must not.
    args = [sys.executable, "-m", "gptforge.cli", "pretrain", "--data", str(tiny_shards), "--out", str(run),
            "--model.preset", "gpt2-nano", "--model.block_size", "32", "--train.max_steps", "1000",
            "--train.micro_batch_size", "2", "--train.gradient_accumulation_steps", "400",
            "--train.eval_interval", "0", "--train.tensorboard", "false", "--train.report", "false", "--quiet"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        deadline = time.monotonic() + 120
        while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text().strip():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no step within 120 s"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        proc.wait(timeout=30)
        assert time.monotonic() - t0 < 1.0, "the second Ctrl-C must end the run at once"
        assert proc.returncode in (130, -signal.SIGINT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_long_evaluation_checks_the_stop_flag_between_batches(tiny_shards):
    import numpy as np

    from gptforge.data.loader import TokenStream
    from gptforge.data.shards import load_meta
    from gptforge.eval.perplexity import evaluate_windows
    from gptforge.model.gpt import GPT

    meta = load_meta(tiny_shards)
    stream = TokenStream([tiny_shards / f for f in meta["splits"]["train"]["files"]], meta["dtype"])
    model = GPT(ModelConfig(preset="gpt2-nano", block_size=32, vocab_size=meta["vocab_size"]).resolved())
    offsets = np.arange(0, 64 * 40, 64)
    calls = []

    def stop_after_two():
        calls.append(1)
        return len(calls) > 2

    assert evaluate_windows(model, stream, offsets, 32, 4, torch.device("cpu"), "fp32", stop_after_two) is None
    assert len(calls) == 3  # two batches ran, the third was not started
    assert evaluate_windows(model, stream, offsets, 32, 4, torch.device("cpu"), "fp32") > 0
