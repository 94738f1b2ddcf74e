"""Ctrl-C: a second SIGINT ends the run at once, and a long evaluation checks the stop flag between
batches."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import torch

from gptforge.config import ModelConfig


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

