"""Non-finite steps, early stopping, signals, and flat memory while reading windows."""

import math
import os
import signal
import subprocess
import sys
import time

import pytest

import gptforge.train.objectives.next_token as next_token_lib
import gptforge.train.run as loop
from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.data.loader import TokenStream, TrainBatches
from gptforge.data.shards import load_meta
from gptforge.runtime import checkpoint as ck
from gptforge.train.loggers import read_metrics


def _cfg(**kw):
    base = dict(max_steps=12, micro_batch_size=4, lr=3e-3, warmup_steps=2, eval_interval=0,
                checkpoint_interval=2, tensorboard=False)
    base.update(kw)
    return RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32), train=TrainConfig(**base))


def test_non_finite_steps_are_skipped_then_stop_the_run(tiny_shards, tmp_path, monkeypatch):
    real = next_token_lib.token_loss_sum
    calls = {"n": 0}

    def poisoned(logits, targets):
        calls["n"] += 1
        out = real(logits, targets)
        # micro-batch 3 (step 3) is NaN once; from micro-batch 6 on every step is NaN.
        return out * float("nan") if calls["n"] == 3 or calls["n"] >= 6 else out

    monkeypatch.setattr(next_token_lib, "token_loss_sum", poisoned)
    with pytest.raises(RuntimeError, match="consecutive steps with a non-finite"):
        loop.train(_cfg(max_bad_steps=3), tiny_shards, tmp_path / "run", progress=False)
    rows = read_metrics(tmp_path / "run")
    assert [r["skipped"] for r in rows] == [False, False, True, False, False, True, True, True]
    assert rows[2]["loss"] is None and math.isfinite(rows[3]["loss"])
    # The last good checkpoint (step 4) is kept and names itself latest; nothing after it was written.
    assert ck.find_checkpoint(tmp_path / "run").name == "step_0000004"


def test_early_stopping(tiny_shards, tmp_path):
    # lr 0: the val loss never improves after the first evaluation.
    r = loop.train(_cfg(lr=0.0, min_lr=0.0, eval_interval=2, eval_steps=1, patience=2), tiny_shards,
                   tmp_path / "run", progress=False)
    assert r.stopped == "early_stopping" and r.step == 6
    assert (tmp_path / "run" / "checkpoints" / "best").read_text().strip() == "step_0000002"


def test_sigterm_writes_a_checkpoint_and_resume_continues(tiny_shards, tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "gptforge.cli", "pretrain", "--data", str(tiny_shards), "--out", str(run),
           "--model.preset", "gpt2-nano", "--model.block_size", "32", "--train.max_steps", "100000",
           "--train.micro_batch_size", "2", "--train.eval_interval", "0", "--train.checkpoint_interval", "0",
           "--train.tensorboard", "false", "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not ((run / "metrics.jsonl").exists()
                                          and len(read_metrics(run)) >= 3):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err  # as a shell reports a killed program
    assert "stopped (signal)" in out
    ckpt = ck.find_checkpoint(run)
    step = ck.load_trainer_state(ckpt)["step"]
    assert step >= 3 and ckpt.name == f"step_{step:07d}"
    res = loop.train(RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32),
                               train=TrainConfig(max_steps=step + 2, micro_batch_size=2, eval_interval=0,
                                                 tensorboard=False)),
                     tiny_shards, run, resume=True, progress=False)
    assert res.step == step + 2


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux)")
def test_reading_windows_keeps_memory_flat(tiny_shards):
    meta = load_meta(tiny_shards)
    stream = TokenStream([tiny_shards / f for f in meta["splits"]["train"]["files"]], meta["dtype"])
    batches = TrainBatches(stream, 64, 8, 1, seed=0)
    for step in range(50):
        batches.micro_batches(step)
    before = _rss_bytes()
    for step in range(50, 2050):
        batches.micro_batches(step)
    grown = _rss_bytes() - before
    stream.close()
    assert grown < 4 * 2**20, f"resident memory grew by {grown / 2**20:.1f} MiB over 2000 batches"
