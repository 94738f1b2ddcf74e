"""Tiny trained runs for the compression tests (a few steps on the shared tiny shards)."""

from __future__ import annotations

import pytest

from gptforge.config import ModelConfig, RunConfig, TrainConfig


def train_tiny(data, run_dir, arch: str, steps: int = 8):
    from gptforge.train.loop import train

    if arch == "gpt2":
        model = ModelConfig(preset="gpt2-nano", block_size=32)
    else:
        model = ModelConfig(preset="llama-nano", d_ff=128, block_size=32)
    tc = TrainConfig(max_steps=steps, micro_batch_size=4, lr=3e-3, warmup_steps=2, eval_interval=0,
                     checkpoint_interval=0, tensorboard=False)
    train(RunConfig(model=model, train=tc), data, run_dir, progress=False)
    return run_dir


@pytest.fixture(scope="session")
def gpt2_run(tiny_shards, tmp_path_factory):
    return train_tiny(tiny_shards, tmp_path_factory.mktemp("runs") / "gpt2", "gpt2")


@pytest.fixture(scope="session")
def llama_run(tiny_shards, tmp_path_factory):
    return train_tiny(tiny_shards, tmp_path_factory.mktemp("runs") / "llama", "llama")
