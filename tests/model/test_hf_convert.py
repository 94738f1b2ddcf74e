"""Hugging Face <-> gptforge conversion: logits, round trips, greedy generation, tokenizer export.

Tiny random models are built locally with transformers' config classes (no hub, no internet).
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from gptforge.config import ModelConfig  # noqa: E402
from gptforge.model.gpt import GPT  # noqa: E402
from gptforge.model.hf import (  # noqa: E402
    UnsupportedHFConfig,
    config_from_hf,
    load_hf_model,
    read_hf_config,
    read_hf_state_dict,
)
from gptforge.model.hf_save import save_hf  # noqa: E402

VOCAB = 97


def _hf_configs():
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=72, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)
    return {
        "gpt2": GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=VOCAB, n_positions=64,
                           bos_token_id=1, eos_token_id=2),
        # GQA (2 KV heads for 4 query heads), untied head, Llama 3.1 RoPE scaling.
        "llama": LlamaConfig(**common, num_key_value_heads=2, tie_word_embeddings=False, rope_theta=500000.0,
                             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
        # q/k/v biases, tied embeddings.
        "qwen2": Qwen2Config(**common, num_key_value_heads=2, tie_word_embeddings=True),
        "mistral": MistralConfig(**common, num_key_value_heads=1, sliding_window=None, tie_word_embeddings=False),
    }


def _hf_model(name: str, seed: int = 0):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(_hf_configs()[name]).eval()
    with torch.no_grad():
        # Random init leaves norms at 1 and biases at 0; perturb every tensor so that a wrong
        # mapping of any of them shows in the logits.
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.generation_config.eos_token_id = None  # greedy runs its full length
    model.generation_config.pad_token_id = 0
    return model


@pytest.fixture(scope="module", params=["gpt2", "llama", "qwen2", "mistral"])
def hf_folder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    _hf_model(request.param).save_pretrained(path)
    return request.param, path


def _greedy(model: GPT, idx: torch.Tensor, n: int) -> torch.Tensor:
    from gptforge.infer.generate import generate

    return generate(model, idx, n, temperature=0)  # KV-cache path


def test_logits_match_transformers(hf_folder):
    name, path = hf_folder
    hf = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    ours = load_hf_model(path).eval()
    idx = torch.randint(0, VOCAB, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(idx).logits
        got = ours(idx)
    assert got.shape == ref.shape
    assert (got - ref).abs().max().item() < 1e-4, name
    assert ours.config.tie_embeddings == (ours.lm_head.weight is ours.wte.weight)


def test_llama_rope_scaling_is_used(tmp_path):
    ours = load_hf_model(_save(_hf_model("llama"), tmp_path)).eval()
    assert ours.config.rope_scaling["rope_type"] == "llama3"
    plain = GPT(ModelConfig(**{**ours.config.__dict__, "rope_scaling": None}))
    plain.load_state_dict(ours.state_dict())
    idx = torch.randint(0, VOCAB, (1, 48))
    with torch.no_grad():
        assert (plain.eval()(idx) - ours(idx)).abs().max() > 1e-3  # scaling changes positions > 16


def test_round_trip_reloads_identical(hf_folder, tmp_path):
    name, path = hf_folder
    ours = load_hf_model(path)
    out = save_hf(ours, ours.config, tmp_path / "out", base_config=read_hf_config(path))
    src, dst = read_hf_state_dict(path), read_hf_state_dict(out)
    assert set(src) == set(dst), name
    for k in src:
        assert src[k].dtype == dst[k].dtype and torch.equal(src[k], dst[k]), k
    a = transformers.AutoModelForCausalLM.from_pretrained(path).state_dict()
    b = transformers.AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert type(transformers.AutoModelForCausalLM.from_pretrained(out)).__name__ == \
        type(transformers.AutoModelForCausalLM.from_pretrained(path)).__name__
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_greedy_20_tokens_equals_transformers(hf_folder):
    name, path = hf_folder
    hf = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    ours = load_hf_model(path).eval()
    idx = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf.generate(idx, max_new_tokens=20, do_sample=False)
        got = _greedy(ours, idx, 20)
    assert ref.shape == (1, 29)
    assert torch.equal(got, ref), name


def test_fresh_export_without_base_config(hf_folder, tmp_path):
    """Export from the gptforge config alone (as for a model pretrained with gptforge)."""
    name, path = hf_folder
    ours = load_hf_model(path).eval()
    out = save_hf(ours, ours.config, tmp_path / "fresh")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == {"mistral": "llama"}.get(name, name)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    idx = torch.randint(0, VOCAB, (2, 40))
    with torch.no_grad():
        assert (hf(idx).logits - ours(idx)).abs().max() < 1e-4


def test_sharded_and_bin_checkpoints_read(tmp_path):
    hf = _hf_model("llama")
    ours = load_hf_model(_save(hf, tmp_path / "single"))
    sharded = save_hf(ours, ours.config, tmp_path / "sharded", max_shard_bytes=20_000)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    assert not (sharded / "model.safetensors").exists()
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(sharded).eval()
    idx = torch.randint(0, VOCAB, (1, 30))
    with torch.no_grad():
        assert (reloaded(idx).logits - hf(idx).logits).abs().max() < 1e-5
        assert (load_hf_model(sharded)(idx) - ours(idx)).abs().max() == 0
    binary = tmp_path / "bin"
    binary.mkdir()
    (binary / "config.json").write_text((sharded / "config.json").read_text())
    torch.save(hf.state_dict(), binary / "pytorch_model.bin")
    with torch.no_grad():
        assert (load_hf_model(binary)(idx) - ours(idx)).abs().max() == 0


def _save(model, path):
    model.save_pretrained(path)
    return path


def test_dtype_kept_and_cast(tmp_path):
    hf = _hf_model("qwen2").to(torch.bfloat16)
    path = _save(hf, tmp_path / "bf16")
    ours = load_hf_model(path)
    assert ours.wte.weight.dtype == torch.bfloat16
    assert load_hf_model(path, dtype=torch.float32).wte.weight.dtype == torch.float32
    out = save_hf(ours, ours.config, tmp_path / "out", base_config=read_hf_config(path))
    assert read_hf_state_dict(out)["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"


@pytest.mark.parametrize(
    "model_type, change, field",
    [
        ("llama", {"hidden_act": "gelu"}, "hidden_act"),
        ("llama", {"head_dim": 15}, "head_dim"),  # odd: RoPE rotates pairs (another even width is head_size)
        ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type"),
        ("llama", {"attention_bias": True, "mlp_bias": False}, "mlp_bias"),
        ("mistral", {"sliding_window": 16}, "sliding_window"),
        ("qwen2", {"use_sliding_window": True}, "use_sliding_window"),
        ("gpt2", {"activation_function": "relu"}, "activation_function"),
        ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
        ("bert", {}, "model_type"),
    ],
)
def test_unsupported_field_is_named(model_type, change, field):
    base = _hf_configs().get(model_type)
    raw = base.to_dict() if base is not None else {"model_type": model_type}
    raw.pop("rope_parameters", None) if "rope_scaling" in change else None
    raw.update(change)
    with pytest.raises(UnsupportedHFConfig, match=field.replace(".", r"\.")):
        config_from_hf(raw, where="x/config.json")


def test_missing_weights_and_config_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_hf_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(_hf_configs()["gpt2"].to_dict()))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_hf_model(tmp_path)


def _train_tokenizer(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    import inspect

    text = inspect.getsource(json).splitlines()
    tok.train_from_iterator(text, trainer)
    tok.save(str(path / "tokenizer.json"))
    return tok


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_gptforge_model_with_own_tokenizer_exports(arch, tmp_path):
    """A gptforge model + its bare tokenizer.json -> AutoTokenizer/AutoModelForCausalLM agree."""
    tok = _train_tokenizer(tmp_path)
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, n_layer=2, n_head=4, n_kv_head=2, d_model=32, block_size=64,
                      vocab_size=tok.get_vocab_size()).resolved()
    model = GPT(cfg).eval()
    out = save_hf(model, cfg, tmp_path / "hf", tokenizer_dir=tmp_path)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    text = "def dumps(obj, *, skipkeys=False) -> 汉字 😀"
    ids = tok.encode(text).ids
    assert hf_tok(text)["input_ids"] == ids
    assert hf_tok.decode(ids) == text
    assert hf_tok.eos_token == "<|endoftext|>" and hf_tok.eos_token_id == tok.token_to_id("<|endoftext|>")
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == hf_tok.eos_token_id
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    hf.generation_config.eos_token_id = None
    idx = torch.tensor([ids[:8]])
    with torch.no_grad():
        ref = hf.generate(idx, max_new_tokens=20, do_sample=False, pad_token_id=0)
        got = _greedy(model, idx, 20)
    assert torch.equal(ref, got)
    if arch == "gpt2":
        assert "lm_head.weight" not in read_hf_state_dict(out)  # tied: stored once


def test_export_is_atomic_and_refuses_overwrite(tmp_path):
    cfg = ModelConfig(preset="gpt2-nano", vocab_size=50).resolved()
    model = GPT(cfg)
    out = save_hf(model, cfg, tmp_path / "m")
    with pytest.raises(FileExistsError, match="--overwrite"):
        save_hf(model, cfg, out)
    save_hf(model, cfg, out, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temp or old folder left


@pytest.mark.parametrize("arch, extra", [
    ("gpt2", dict(bias=False, n_kv_head=2)),                    # zero biases, K/V heads repeated
    ("gpt2", dict(tie_embeddings=False)),
    ("llama", dict(bias=True, qkv_bias=False)),                 # zero q/k/v biases in Llama
    ("llama", dict(bias=True)),                                 # attention_bias = mlp_bias = True
    ("llama", dict(rope_scaling={"rope_type": "linear", "factor": 2.0}, tie_embeddings=True)),
])
def test_gptforge_variants_export_exactly(arch, extra, tmp_path):
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, n_layer=2, n_head=4, d_model=32, block_size=48, vocab_size=VOCAB, **extra).resolved()
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    out = save_hf(model, cfg, tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    idx = torch.randint(0, VOCAB, (2, 48))
    with torch.no_grad():
        assert (hf(idx).logits - model(idx)).abs().max() < 1e-4
    if arch == "llama" and cfg.qkv_bias == cfg.bias:  # representable as is: comes back identical
        back = load_hf_model(out)
        assert back.config.rope_scaling == cfg.rope_scaling and back.config.bias == cfg.bias
        a, b = back.state_dict(), model.state_dict()
        assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_shorter_block_size(tmp_path):
    for name in ("gpt2", "llama"):
        path = _save(_hf_model(name), tmp_path / name)
        hf = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
        ours = load_hf_model(path, block_size=24).eval()
        assert ours.config.block_size == 24
        idx = torch.randint(0, VOCAB, (1, 24))
        with torch.no_grad():
            assert (ours(idx) - hf(idx).logits).abs().max() < 1e-4
    with pytest.raises(UnsupportedHFConfig, match="n_positions"):
        load_hf_model(tmp_path / "gpt2", block_size=128)
