"""Fixtures for the export tests: one tiny run per block family, trained a few steps on the shared
tiny shards so that greedy continuations are not decided by near-tied logits."""

from __future__ import annotations

import pytest

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 16}

MODELS = {
    # GQA (4 query heads, 2 KV heads), untied head, RMSNorm, SwiGLU, RoPE with llama3 scaling.
    "llama": dict(preset="llama-nano", d_model=32, n_head=4, n_kv_head=2, d_ff=96, block_size=64,
                  rope_scaling=LLAMA3_SCALING),
    # The recommended recipe (Qwen3 blocks): QK-norm, SwiGLU, untied head, no logit cap.
    "qwen3": dict(preset="qwen3-nano", d_model=32, n_head=2, block_size=64),
    # Learned positions, LayerNorm with biases, tanh GELU, tied embeddings.
    "gpt2": dict(preset="gpt2-nano", d_model=32, n_head=2, block_size=64, activation="gelu_tanh"),
}


@pytest.fixture(scope="session")
def trained_runs(tiny_shards, tmp_path_factory):
    """{"llama": run_dir, "qwen3": run_dir, "gpt2": run_dir}, each trained 40 steps (about a second each)."""
    from gptforge.config import ModelConfig, RunConfig, TrainConfig
    from gptforge.train.run import train

    root = tmp_path_factory.mktemp("runs")
    runs = {}
    for arch, model in MODELS.items():
        cfg = RunConfig(model=ModelConfig(**model),
                        train=TrainConfig(max_steps=40, micro_batch_size=8, lr=1e-2, min_lr=1e-3, warmup_steps=4,
                                          eval_interval=0, checkpoint_interval=0, tensorboard=False, seed=0))
        train(cfg, tiny_shards, root / arch, progress=False)
        runs[arch] = root / arch
    return runs


@pytest.fixture(scope="session")
def onnx_exports(trained_runs, tmp_path_factory):
    """{arch: folder} written by `gptforge export RUN --format onnx` (the CLI path)."""
    from gptforge.cli import main

    root = tmp_path_factory.mktemp("onnx")
    out = {}
    for arch, run in trained_runs.items():
        assert main(["export", str(run), "--format", "onnx", "--out", str(root / arch)]) == 0
        out[arch] = root / arch
    return out


def val_tokens(shards, n: int = 2000):
    """The first n validation token ids of a shard folder (numpy int64)."""
    import numpy as np

    files = sorted(shards.glob("val_*.bin"))
    from gptforge.data.shards import load_meta

    dtype = load_meta(shards)["dtype"]
    return np.fromfile(files[0], dtype=dtype)[:n].astype(np.int64)


# Compression tests (quantize, prune, distil): tiny runs trained a few steps.

def train_tiny(data, run_dir, arch: str, steps: int = 8):
    from gptforge.config import ModelConfig, RunConfig, TrainConfig
    from gptforge.train.run import train

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


def assert_llama_cpp_logits_match(llm, model, ids: list[int], atol: float = 1e-3) -> None:
    """llama.cpp's logits for `ids` (every position) equal gptforge's `model` within `atol`; closes `llm`."""
    import numpy as np
    import torch

    try:
        llm.eval(ids)
        with torch.no_grad():
            ours = model(torch.tensor([ids]))[0].numpy()
        np.testing.assert_allclose(np.array(llm.scores[: len(ids)]), ours, atol=atol, rtol=0)
    finally:
        llm.close()
