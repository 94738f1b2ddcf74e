"""The recipe the quickstart and README recommend exports exactly: hf (transformers), gguf
(llama.cpp, in test_export_gguf.py) and onnx (test_export_onnx.py) all take a tiny model of it."""

from __future__ import annotations

import inspect
import json

import pytest
import torch

from gptforge.cli import main
from gptforge.config import ModelConfig
from gptforge.export.gguf import check_representable, gguf_arch
from gptforge.model.hf import check_exportable, hf_model_type
from gptforge.runtime.loading import load_model_checkpoint

from .conftest import MODELS, val_tokens


def test_the_quickstart_preset_is_the_tested_qwen3_recipe():
    from gptforge.quickstart import run_quickstart

    preset = inspect.signature(run_quickstart).parameters["preset"].default
    cfg = ModelConfig(preset=preset).resolved()
    check_exportable(cfg)
    check_representable(cfg)
    assert (hf_model_type(cfg), gguf_arch(cfg)) == ("qwen3", "qwen3")
    tiny = ModelConfig(**MODELS["qwen3"]).resolved()
    # The tiny model the export tests train has every option of the recommended preset.
    for option in ("arch", "qk_norm", "activation", "logit_softcap", "tie_embeddings", "zero_init_proj", "bias",
                   "norm_eps", "value_embeddings"):
        assert getattr(tiny, option) == getattr(cfg, option), option


def test_qwen3_run_loads_in_transformers_with_equal_logits_and_greedy(trained_runs, tiny_shards, tmp_path):
    transformers = pytest.importorskip("transformers")
    run = trained_runs["qwen3"]
    out = tmp_path / "hf"
    assert main(["export", str(run), "--format", "hf", "--dtype", "f32", "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    model, _ = load_model_checkpoint(run)
    model = model.float().eval()
    ids = torch.from_numpy(val_tokens(tiny_shards, 2 * 48).reshape(2, 48))
    with torch.no_grad():
        diff = (hf(ids).logits - model(ids)).abs().max().item()
    assert diff < 1e-4, diff
    from gptforge.infer.generate import generate

    prompt = ids[:1, :12]
    want = generate(model, prompt, 16, temperature=0)[0, 12:].tolist()
    got = hf.generate(prompt, max_new_tokens=16, do_sample=False, min_new_tokens=16)[0, 12:].tolist()
    assert got == want
    tok = transformers.AutoTokenizer.from_pretrained(out)
    from gptforge.data.tokenizer import Tokenizer

    text = "def f(x):\n    return x  # done"
    assert tok(text)["input_ids"] == Tokenizer.from_file(run / "tokenizer.json").encode(text)
