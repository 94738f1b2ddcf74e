"""`gptforge export --format gguf`: read back with gguf-py's GGUFReader, and run by llama.cpp
(llama-cpp-python) when it is installed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from gptforge.cli import main  # noqa: E402
from gptforge.data.tokenizer import Tokenizer  # noqa: E402
from gptforge.export.gguf import gguf_tensors, permute_rope_rows, quant_error_bound  # noqa: E402
from gptforge.infer.generate import generate  # noqa: E402
from gptforge.runtime.loading import load_model_checkpoint  # noqa: E402

from .conftest import assert_llama_cpp_logits_match, val_tokens  # noqa: E402

TEXTS = ["The quick brown fox jumps over the lazy dog.\n\n    def f(x):\n        return x",
         "你好，世界！今天天气很好。", "emoji: 😀🎉👍🏽 ❤️ done"]


def _export(run, out, *args) -> "gguf.GGUFReader":
    assert main(["export", str(run), "--format", "gguf", "--out", str(out), *args]) == 0
    import yaml

    files = list(out.glob("*.gguf"))
    block_size = yaml.safe_load((run / "config.yaml").read_text())["model"]["block_size"]
    assert len(files) == 1 and (out / "Modelfile").read_text() == (  # ollama kept to the trained context
        f"FROM ./{files[0].name}\nPARAMETER num_ctx {block_size}\n")
    return gguf.GGUFReader(files[0])


def _field(reader, key):
    return reader.fields[key].contents()


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gpt2"])
def test_gguf_metadata_and_f32_tensors(arch, trained_runs, tmp_path):
    model, _ = load_model_checkpoint(trained_runs[arch])
    cfg = model.config
    reader = _export(trained_runs[arch], tmp_path / "g", "--dtype", "f32")
    assert _field(reader, "general.architecture") == arch
    assert _field(reader, f"{arch}.context_length") == cfg.block_size == 64
    assert _field(reader, f"{arch}.block_count") == 2
    assert _field(reader, f"{arch}.attention.head_count") == cfg.n_head
    assert _field(reader, f"{arch}.attention.head_count_kv") == cfg.n_kv_head
    if arch != "gpt2":
        assert _field(reader, f"{arch}.attention.key_length") == cfg.head_dim
        assert _field(reader, f"{arch}.attention.value_length") == cfg.head_dim
    tok = Tokenizer.from_file(trained_runs[arch] / "tokenizer.json")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    assert len(tokens) == cfg.vocab_size == tok.vocab_size
    assert all(tokens[i] == tok.id_to_token(i) for i in range(tok.vocab_size))
    assert _field(reader, "tokenizer.ggml.model") == "gpt2" and _field(reader, "tokenizer.ggml.pre") == "gpt-2"
    assert _field(reader, "tokenizer.ggml.eos_token_id") == tok.eos_id == 0
    types = _field(reader, "tokenizer.ggml.token_type")
    assert types[0] == gguf.TokenType.CONTROL and types[300] == gguf.TokenType.NORMAL
    assert len(_field(reader, "tokenizer.ggml.merges")) == tok.vocab_size - 257
    if arch == "llama":
        assert _field(reader, "llama.rope.freq_base") == cfg.rope_theta
        assert "llama.rope.scaling.factor" not in reader.fields  # llama3 scaling is the rope_freqs tensor

    tensors = {t.name: t for t in reader.tensors}
    want = dict(gguf_tensors(model))
    assert set(tensors) == set(want)
    for name, t in tensors.items():
        assert t.tensor_type == gguf.GGMLQuantizationType.F32
        np.testing.assert_array_equal(np.asarray(t.data).reshape(want[name].shape), want[name].numpy())
    if arch == "llama":
        # q/k rows permuted to llama.cpp's interleaved RoPE layout (k with the KV head count).
        q = model.blocks[0].attn.q_proj.weight.detach()
        k = model.blocks[0].attn.k_proj.weight.detach()
        got_q = np.asarray(tensors["blk.0.attn_q.weight"].data).reshape(q.shape)
        got_k = np.asarray(tensors["blk.0.attn_k.weight"].data).reshape(k.shape)
        hd = cfg.head_dim
        # Head 0's row pair (i, i + hd/2) of the HF layout becomes rows (2i, 2i + 1).
        np.testing.assert_array_equal(got_q[1], q[hd // 2].numpy())
        np.testing.assert_array_equal(got_k[hd + 2], k[hd + 1].numpy())
        assert torch.equal(permute_rope_rows(k, cfg.n_kv_head).reshape(cfg.n_kv_head, hd, -1)[1],
                           torch.from_numpy(got_k.copy()).reshape(cfg.n_kv_head, hd, -1)[1])
        assert "rope_freqs.weight" in tensors and "output.weight" in tensors
    elif arch == "qwen3":
        # llama.cpp's qwen3 rotates halves (NeoX RoPE) as gptforge does: q and k as they are.
        attn = model.blocks[1].attn
        for x in "qk":
            got = np.asarray(tensors[f"blk.1.attn_{x}.weight"].data)
            np.testing.assert_array_equal(got.reshape(-1), getattr(attn, f"{x}_proj").weight.detach().reshape(-1).numpy())
            norm = np.asarray(tensors[f"blk.1.attn_{x}_norm.weight"].data)
            assert norm.shape == (cfg.head_dim,)
            np.testing.assert_array_equal(norm, getattr(attn, f"{x}_norm").weight.detach().numpy())
        assert "output.weight" in tensors and "rope_freqs.weight" not in tensors
    else:
        assert "blk.0.attn_qkv.weight" in tensors and "output.weight" not in tensors  # tied


@pytest.mark.parametrize("quant", ["q8_0", "q4_0"])
def test_gguf_quantized_values_within_the_format_bound(quant, trained_runs, tmp_path):
    run = trained_runs["llama"]
    model, _ = load_model_checkpoint(run)
    reader = _export(run, tmp_path / quant, "--quantize", quant)
    want = dict(gguf_tensors(model))
    qtype = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}[quant]
    n_quant = 0
    for t in reader.tensors:
        ref = want[t.name].numpy()
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            assert ref.ndim == 1 or t.name.startswith("rope_freqs")
            continue
        assert t.tensor_type == qtype, t.name
        n_quant += 1
        got = gguf.quants.dequantize(np.asarray(t.data), qtype).reshape(ref.shape)
        blocks, got_b = ref.reshape(-1, 32), got.reshape(-1, 32)
        bounds = np.array([quant_error_bound(b, quant) for b in blocks])
        err = np.abs(blocks - got_b).max(axis=1)
        assert (err <= bounds).all(), (t.name, float((err - bounds).max()))
        assert err.max() > 0  # really quantized
    assert n_quant == 2 * 7 + 2  # 7 matrices per block, token embedding and untied head
    sizes = {"q8_0": 34, "q4_0": 18}[quant]  # bytes per 32 values
    assert reader.tensors[0].n_bytes == want["token_embd.weight"].numel() // 32 * sizes


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_gguf_half_precision_matrices_round_like_torch(dtype, trained_runs, tmp_path):
    run = trained_runs["gpt2"]
    model, _ = load_model_checkpoint(run)
    reader = _export(run, tmp_path / dtype, "--dtype", dtype)
    want = dict(gguf_tensors(model))
    qtype = {"f16": gguf.GGMLQuantizationType.F16, "bf16": gguf.GGMLQuantizationType.BF16}[dtype]
    tdtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    assert _field(reader, "general.file_type") == {"f16": 1, "bf16": 32}[dtype]
    for t in reader.tensors:
        ref = want[t.name]
        if ref.dim() == 1 or t.name == "position_embd.weight":
            assert t.tensor_type == gguf.GGMLQuantizationType.F32
            continue
        assert t.tensor_type == qtype, t.name
        got = gguf.quants.dequantize(np.asarray(t.data), qtype).reshape(ref.shape)
        np.testing.assert_array_equal(got, ref.to(tdtype).float().numpy())


def test_gguf_embeds_the_chat_template(trained_runs, tmp_path):
    import shutil

    from gptforge.export.gguf import write_gguf

    model, _ = load_model_checkpoint(trained_runs["llama"])
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    shutil.copy(trained_runs["llama"] / "tokenizer.json", tok_dir)
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    (tok_dir / "chat_template.jinja").write_text(template)
    reader = gguf.GGUFReader(write_gguf(model, tok_dir, tmp_path / "m.gguf", dtype="f32"))
    assert _field(reader, "tokenizer.chat_template") == template
    reader = gguf.GGUFReader(write_gguf(model, trained_runs["llama"], tmp_path / "n.gguf", dtype="f32"))
    assert "tokenizer.chat_template" not in reader.fields


def test_gguf_refuses_what_it_cannot_represent(trained_runs, tiny_shards, tmp_path, capsys):
    from gptforge.config import ModelConfig, RunConfig, TrainConfig
    from gptforge.train.run import train

    exact = tmp_path / "exact"
    train(RunConfig(model=ModelConfig(preset="gpt2-nano", d_model=32, block_size=32),
                    train=TrainConfig(max_steps=1, micro_batch_size=2, eval_interval=0, tensorboard=False)),
          tiny_shards, exact, progress=False)
    # Exact GELU: written for llama.cpp's tanh-GELU graph by default, with a one-line note.
    assert main(["export", str(exact), "--format", "gguf", "--out", str(tmp_path / "n")]) == 0
    notes = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("gptforge export: note:")]
    assert len(notes) == 1 and "model.activation=gelu (exact, erf)" in notes[0] and "tanh" in notes[0]
    assert main(["export", str(exact), "--format", "gguf", "--no-approximate-gelu", "--out",
                 str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "model.activation=gelu" in err and "gguf format" in err and "--no-approximate-gelu" in err
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob(".o.tmp*"))
    assert main(["export", str(exact), "--format", "gguf", "--out", str(tmp_path / "o")]) == 0
    assert main(["export", str(exact), "--format", "gguf", "--quantize", "int8", "--out", str(tmp_path / "p")]) == 2  # USAGE_EXIT
    assert "--quantize int8 cannot be written in the gguf format" in capsys.readouterr().err


# ---- llama.cpp itself -----------------------------------------------------------------------

def _llama(path, n_ctx=64):
    llama_cpp = pytest.importorskip("llama_cpp")
    # f32 KV cache (type 0 = GGML_TYPE_F32): the default f16 cache alone moves logits ~1e-3.
    return llama_cpp.Llama(str(path), n_ctx=n_ctx, logits_all=True, verbose=False, n_threads=1,
                           type_k=0, type_v=0, seed=0)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gpt2"])
def test_llama_cpp_logits_greedy_and_tokenizer(arch, trained_runs, tiny_shards, tmp_path):
    pytest.importorskip("llama_cpp")
    run = trained_runs[arch]
    model, _ = load_model_checkpoint(run)
    model = model.float().eval()
    _export(run, tmp_path / "g", "--dtype", "f32")
    llm = _llama(next((tmp_path / "g").glob("*.gguf")))
    try:
        ids = val_tokens(tiny_shards, 48).tolist()
        llm.reset()
        llm.eval(ids)
        theirs = np.array(llm.scores[: len(ids)])
        with torch.no_grad():
            ours = model(torch.tensor([ids]))[0].numpy()
        np.testing.assert_allclose(theirs, ours, atol=1e-3, rtol=0)

        prompt = ids[:12]
        want = generate(model, torch.tensor([prompt]), 20, temperature=0)[0, 12:].tolist()
        llm.reset()
        got = []
        for tok in llm.generate(prompt, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0):
            got.append(tok)
            if len(got) == 20:
                break
        assert got == want

        tok = Tokenizer.from_file(run / "tokenizer.json")
        for text in TEXTS:
            assert llm.tokenize(text.encode(), add_bos=False, special=False) == tok.encode(text), text
            assert llm.detokenize(tok.encode(text)).decode() == text
    finally:
        llm.close()


@pytest.mark.parametrize("extra", [
    dict(preset="llama-nano", bias=True, qkv_bias=True),  # biases everywhere, tied head
    dict(preset="llama-nano", rope_scaling={"rope_type": "linear", "factor": 2.0}, n_kv_head=1),  # MQA
    dict(preset="gpt2-nano", activation="gelu_tanh", bias=False, n_kv_head=1),  # no biases: zeros written
    dict(preset="gpt2-nano"),  # exact GELU, written for llama.cpp's tanh GELU by default: still within 1e-3
    dict(preset="qwen3-nano", n_kv_head=1, tie_embeddings=True),  # QK-norm with MQA and a tied head
], ids=["llama-biases", "llama-linear-rope-mqa", "gpt2-no-bias-mqa", "gpt2-exact-gelu", "qwen3-mqa-tied"])
def test_llama_cpp_logits_for_other_block_options(extra, tiny_shards, tmp_path):
    pytest.importorskip("llama_cpp")
    from gptforge.config import ModelConfig
    from gptforge.export.gguf import write_gguf
    from gptforge.model.gpt import GPT

    torch.manual_seed(0)
    extra = dict(extra)
    tie = extra.pop("tie_embeddings", None) or (extra["preset"] == "llama-nano" and extra.get("bias", False))
    model = GPT(ModelConfig(vocab_size=384, d_model=32, block_size=64, tie_embeddings=tie or None, **extra)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # biases and norms away from their 0 / 1 init
    path = write_gguf(model, tiny_shards, tmp_path / "m.gguf", dtype="f32")
    llm = _llama(path)
    assert_llama_cpp_logits_match(llm, model, val_tokens(tiny_shards, 40).tolist())


def test_lora_run_is_exported_merged(trained_runs, tmp_path):
    """A LoRA fine-tune of the llama run: the gguf holds base + alpha/r * B @ A, not the base."""
    import json
    import random

    rng = random.Random(0)
    data = tmp_path / "inst.jsonl"
    words = ["".join(rng.choice("abcdefgh") for _ in range(4)) for _ in range(40)]
    data.write_text("".join(json.dumps({"prompt": f"reverse: {w}\n", "completion": w[::-1]}) + "\n" for w in words))
    lora = tmp_path / "lora"
    assert main(["finetune", "--from", str(trained_runs["llama"]), "--data", str(data), "--out", str(lora),
                 "--train.max_steps", "4", "--train.micro_batch_size", "4", "--finetune.block_size", "32",
                 "--train.lr", "5e-2", "--train.eval_interval", "0", "--train.tensorboard", "false",
                 "--train.device", "cpu", "--train.warmup_steps", "1", "--quiet"]) == 0
    assert (lora / "adapter" / "adapter_config.json").is_file()
    merged, _ = load_model_checkpoint(lora)
    base, _ = load_model_checkpoint(trained_runs["llama"])
    reader = _export(lora, tmp_path / "g", "--dtype", "f32")
    tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
    want = dict(gguf_tensors(merged))
    moved = 0
    for name, ref in dict(gguf_tensors(base)).items():
        np.testing.assert_array_equal(tensors[name].reshape(ref.shape), want[name].numpy())
        moved += not np.array_equal(want[name].numpy(), ref.numpy())
    assert moved >= 2  # the adapted projections of both layers
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is not None:  # llama.cpp's own logits, when installed
        llm = _llama(next((tmp_path / "g").glob("*.gguf")))
        try:
            ids = list(range(1, 30))
            llm.eval(ids)
            with torch.no_grad():
                ours = merged.float()(torch.tensor([ids]))[0].numpy()
            np.testing.assert_allclose(np.array(llm.scores[: len(ids)]), ours, atol=1e-3, rtol=0)
        finally:
            llm.close()
