"""`gptforge convert`: HF folder -> gptforge run directory -> HF folder."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from gptforge.cli import main  # noqa: E402
from gptforge.model.hf import read_hf_state_dict  # noqa: E402
from gptforge.runtime.checkpoint import find_checkpoint  # noqa: E402
from gptforge.runtime.loading import (
    load_for_inference,  # noqa: E402
    load_model_checkpoint,  # noqa: E402
)


def _tiny_qwen2(path, dtype=torch.float32):
    from transformers import Qwen2Config

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=True, bos_token_id=3, eos_token_id=4)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.to(dtype).save_pretrained(path)
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>", "chat_template": "{{ x }}"}))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 4, "temperature": 0.7, "do_sample": True}))
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_convert_round_trip_cli(tmp_path, dtype, capsys):
    src = tmp_path / "hf"
    _tiny_qwen2(src, dtype)
    # Reloaded in fp32 (casting a live HF model would also round its RoPE buffer to bf16).
    hf = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    run = tmp_path / "run"
    assert main(["convert", "--from-hf", str(src), "--out", str(run)]) == 0
    step = find_checkpoint(run)  # the trainer's own loader accepts it
    assert step == run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    assert (run / "config.yaml").is_file() and (run / "tokenizer_config.json").is_file()

    model, found = load_model_checkpoint(run)
    assert found == step and model.wte.weight.dtype == dtype
    assert model.lm_head.weight is model.wte.weight
    idx = torch.randint(0, 64, (2, 20))
    with torch.no_grad():
        assert (model.float()(idx) - hf(idx).logits).abs().max() < 1e-4

    # The trainer's inference loader and generate work on the converted run.
    from gptforge.infer.generate import generate

    lead_model, _, _, _ = load_for_inference(run)
    with torch.no_grad():
        assert (lead_model.float()(idx) - hf(idx).logits).abs().max() < 1e-4
    hf.generation_config.eos_token_id = None
    prompt = idx[:1, :5]
    ref = hf.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(generate(lead_model.float(), prompt, 12, temperature=0), ref)

    back = tmp_path / "back"
    assert main(["convert", "--to-hf", str(run), "--out", str(back)]) == 0
    a, b = read_hf_state_dict(src), read_hf_state_dict(back)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    assert json.loads((back / "generation_config.json").read_text())["temperature"] == 0.7
    assert json.loads((back / "config.json").read_text())["bos_token_id"] == 3
    assert json.loads((back / "tokenizer_config.json").read_text())["chat_template"] == "{{ x }}"
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(back)
    assert type(reloaded).__name__ == "Qwen2ForCausalLM"

    # A step folder works as well as the run dir; --dtype casts.
    f32 = tmp_path / "f32"
    assert main(["convert", "--to-hf", str(step), "--out", str(f32), "--dtype", "float32"]) == 0
    assert read_hf_state_dict(f32)["model.embed_tokens.weight"].dtype == torch.float32


def test_convert_errors_name_the_problem(tmp_path, capsys):
    assert main(["convert", "--from-hf", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 1  # bad input, not a bad option
    assert "config.json" in capsys.readouterr().err
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert main(["convert", "--from-hf", str(tmp_path / "bert"), "--out", str(tmp_path / "o")]) == 1
    assert "model_type" in capsys.readouterr().err
    assert main(["convert", "--to-hf", str(tmp_path), "--out", str(tmp_path / "o")]) == 1
    assert "checkpoints/latest" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    src = tmp_path / "hf"
    _tiny_qwen2(src)
    (tmp_path / "exists").mkdir()
    assert main(["convert", "--from-hf", str(src), "--out", str(tmp_path / "exists")]) == 1
    assert "--overwrite" in capsys.readouterr().err


def test_load_pretrained_from_either_kind(tmp_path):
    from gptforge.runtime.loading import load_pretrained

    src = tmp_path / "hf"
    _tiny_qwen2(src)
    run = tmp_path / "run"
    assert main(["convert", "--from-hf", str(src), "--out", str(run)]) == 0
    a, sa = load_pretrained(src)
    b, sb = load_pretrained(run)
    assert sa["tokenizer_dir"] == src and sb["tokenizer_dir"] == run
    assert sa["hf_config"] == sb["hf_config"] and sa["hf_config"]["model_type"] == "qwen2"
    assert sa["generation_config"]["temperature"] == sb["generation_config"]["temperature"] == 0.7
    sd_a, sd_b = a.state_dict(), b.state_dict()
    assert all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)
    with pytest.raises(FileNotFoundError):
        load_pretrained(tmp_path / "missing")
