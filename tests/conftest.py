"""Shared fixtures: tiny models and tiny shard folders built in the test, no downloads."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
import torch

# Tiny test models gain nothing from a second thread, and OpenMP threads that spin while the
# cores are shared (subprocess tests, a busy CI host) can slow a step 30x: one thread per process,
# inherited by the processes tests start.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)
# `train.precision auto` (the default) measures the CPU; the suite pins fp32 so its figures do
# not depend on the machine (tests of auto itself clear this).
os.environ.setdefault("GPTFORGE_AUTO_PRECISION", "fp32")


@pytest.fixture
def one_thread():
    """One torch thread for the test, restored after it (tiny matmuls: a second thread only fights
    other processes for the cores)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@functools.lru_cache(maxsize=1)
def _all_stdlib_files() -> tuple[Path, ...]:
    """Every standard-library file `stdlib_files()` lists, walked once per session (a walk of the
    standard library costs most of a second, several on a cold disk cache)."""
    from gptforge.data.stdlib_corpus import stdlib_files

    return tuple(stdlib_files())


def stdlib_sample_files(n: int = 40) -> list[Path]:
    """A fixed, small set of real standard-library source files (deterministic)."""
    files = _all_stdlib_files()
    step = max(1, len(files) // n)
    return list(files[::step][:n])


@pytest.fixture(scope="session")
def tiny_shards(tmp_path_factory) -> Path:
    """A prepared shard folder from ~40 standard-library files, vocab 384, one worker."""
    from gptforge.data.prepare import PrepareConfig, prepare

    out = tmp_path_factory.mktemp("shards") / "data"
    cfg = PrepareConfig(inputs=[str(p) for p in stdlib_sample_files()], out=str(out), vocab_size=384,
                        val_fraction=0.1, workers=1)
    prepare(cfg, show_progress=False)
    return out

# torch.distributed.checkpoint logs every save at DEBUG; keep failure reports readable.
import logging  # noqa: E402

logging.getLogger("torch.distributed.checkpoint").setLevel(logging.WARNING)
for _name in ("c10d-NullHandler-dcp_logger", "dcp_logger"):
    logging.getLogger(_name).setLevel(logging.WARNING)


def train_nano_run(shards: Path, run: Path, **train: object) -> Path:
    """Train gpt2-nano (2 layers, d_model 64) at block 64 for 40 steps on `shards` into `run`;
    `train` adds or overrides TrainConfig fields. Returns `run`."""
    from gptforge.config import ModelConfig, RunConfig, TrainConfig
    from gptforge.train.run import train as run_training

    fields = dict(max_steps=40, micro_batch_size=8, lr=3e-3, warmup_steps=4, eval_interval=0, tensorboard=False)
    cfg = RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=64), train=TrainConfig(**{**fields, **train}))
    run_training(cfg, shards, run, progress=False)
    return run


def load_nano_run(run: Path):
    """(model in eval mode on CPU, Tokenizer) of a run folder."""
    from gptforge.data.tokenizer import Tokenizer
    from gptforge.runtime.loading import load_for_inference

    model, _ckpt, _doc, tok = load_for_inference(run, "cpu")
    return model, Tokenizer.from_file(tok)
