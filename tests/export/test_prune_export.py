"""A pruned model exports like any run: each block family (GPT-2, Llama, Llama + QK-norm) pruned
in width, then written as hf (loaded by transformers, equal logits) and gguf (head width in the
metadata; llama.cpp's logits when llama-cpp-python is installed)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gptforge.cli import main
from gptforge.errors import InputError
from gptforge.export.prune import PruneShape, pruned_config
from gptforge.runtime.loading import load_model_checkpoint

from .conftest import assert_llama_cpp_logits_match, val_tokens

FAMILIES = {
    # d_model 64 -> 32: two of four heads (width 16) stay, n_head x head width = d_model.
    "gpt2": (dict(preset="gpt2-nano", n_head=4, block_size=32, activation="gelu_tanh"), ["--d-model", "32"]),
    # Heads 4 -> 2 of width 16 (32 wide) with d_model 48: head_size differs from d_model / n_head.
    "llama": (dict(preset="llama-nano", d_model=64, n_head=4, n_kv_head=2, block_size=32),
              ["--d-model", "48", "--heads-per-layer", "2", "--d-ff", "96"]),
    "qwen3": (dict(preset="qwen3-nano", d_model=64, n_head=4, block_size=32),
              ["--d-model", "48", "--heads-per-layer", "2", "--d-ff", "96"]),
}


@pytest.fixture(scope="module")
def pruned_runs(tiny_shards, tmp_path_factory):
    from gptforge.config import ModelConfig, RunConfig, TrainConfig
    from gptforge.train.run import train

    root = tmp_path_factory.mktemp("pruned")
    runs = {}
    for fam, (model, args) in FAMILIES.items():
        tc = TrainConfig(max_steps=30, micro_batch_size=8, lr=1e-2, min_lr=1e-3, warmup_steps=3, eval_interval=0,
                         checkpoint_interval=0, tensorboard=False, seed=0)
        train(RunConfig(model=ModelConfig(**model), train=tc), tiny_shards, root / fam, progress=False)
        assert main(["prune", str(root / fam), "--calibration", str(tiny_shards), "--out", str(root / f"{fam}-p"),
                     "--calibration-batches", "2", "--calibration-batch-size", "2", "--quiet", *args]) == 0
        runs[fam] = root / f"{fam}-p"
    return runs


@pytest.mark.parametrize("fam", list(FAMILIES))
def test_pruned_run_exports_to_hf_exactly(fam, pruned_runs, tiny_shards, tmp_path):
    transformers = pytest.importorskip("transformers")
    model, _ = load_model_checkpoint(pruned_runs[fam])
    model = model.float().eval()
    cfg = model.config
    assert cfg.n_head * cfg.head_dim == (cfg.d_model if fam == "gpt2" else 32)
    out = tmp_path / "hf"
    assert main(["export", str(pruned_runs[fam]), "--format", "hf", "--dtype", "f32", "--out", str(out)]) == 0
    hf_cfg = json.loads((out / "config.json").read_text())
    if fam != "gpt2":
        assert hf_cfg["head_dim"] == 16 and hf_cfg["hidden_size"] == 48
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    ids = torch.from_numpy(val_tokens(tiny_shards, 32)).view(1, 32)
    with torch.no_grad():
        assert (hf(ids).logits - model(ids)).abs().max() < 1e-4
    from gptforge.model.hf import load_hf_model

    back = load_hf_model(out).eval()  # and back into gptforge, head_dim as head_size
    assert back.config.head_dim == cfg.head_dim and back.config.n_head == cfg.n_head
    with torch.no_grad():
        assert (back(ids) - model(ids)).abs().max() < 1e-5


@pytest.mark.parametrize("fam", list(FAMILIES))
def test_pruned_run_exports_to_gguf(fam, pruned_runs, tiny_shards, tmp_path):
    gguf = pytest.importorskip("gguf")
    model, _ = load_model_checkpoint(pruned_runs[fam])
    model = model.float().eval()
    out = tmp_path / "g"
    assert main(["export", str(pruned_runs[fam]), "--format", "gguf", "--dtype", "f32", "--out", str(out)]) == 0
    path = next(out.glob("*.gguf"))
    reader = gguf.GGUFReader(path)
    arch = reader.fields["general.architecture"].contents()
    assert arch == fam
    if fam != "gpt2":
        assert reader.fields[f"{arch}.attention.key_length"].contents() == model.config.head_dim == 16
        assert reader.fields[f"{arch}.embedding_length"].contents() == 48
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(str(path), n_ctx=32, logits_all=True, verbose=False, n_threads=1, type_k=0, type_v=0)
    assert_llama_cpp_logits_match(llm, model, val_tokens(tiny_shards, 24).tolist())


def test_gpt2_pruning_keeps_heads_times_width_equal_to_d_model():
    from gptforge.config import ModelConfig

    cfg = ModelConfig(preset="gpt2-nano", n_head=4, vocab_size=100).resolved()  # head width 16
    assert (pruned_config(cfg, PruneShape(d_model=48)).n_head, pruned_config(cfg, PruneShape(d_model=48)).head_size) \
        == (3, None)
    with pytest.raises(InputError, match="multiple of 16"):
        pruned_config(cfg, PruneShape(d_model=56))
    with pytest.raises(InputError, match="n_head x head width"):
        pruned_config(cfg, PruneShape(d_model=48, heads_per_layer=2))
