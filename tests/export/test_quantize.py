import pytest
import torch
import torch.nn as nn

from gptforge.errors import InputError
from gptforge.export.quantize import quantize_run
from gptforge.model.quant import (
    Int4Linear,
    Int8Embedding,
    Int8Linear,
    QuantSpec,
    pack_int4,
    quantize_int4,
    quantize_model,
    unpack_int4,
)
from gptforge.runtime.loading import load_for_inference, load_model_checkpoint


def test_int4_packing_round_trips():
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (7, 40), generator=g, dtype=torch.uint8)
    packed = pack_int4(q)
    assert packed.shape == (7, 20) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int4(packed), q)
    # Low nibble = even column.
    assert int(pack_int4(torch.tensor([[3, 12]], dtype=torch.uint8))) == 3 | (12 << 4)
    with pytest.raises(ValueError, match="even"):
        pack_int4(q[:, :3])


def test_int8_weights_within_half_a_step():
    torch.manual_seed(0)
    lin = nn.Linear(48, 24)
    q = Int8Linear.from_linear(lin)
    err = (q.dequantized_weight() - lin.weight).abs()
    step = lin.weight.abs().amax(1, keepdim=True) / 127
    assert bool((err <= step / 2 + 1e-7).all())
    x = torch.randn(2, 5, 48)
    # The dynamic int8-activation path agrees with the float layer to int8 precision.
    assert torch.allclose(q(x), lin(x), atol=0.05)


def test_int4_weights_within_half_a_step():
    torch.manual_seed(0)
    w = torch.randn(16, 64)
    q, scale, zero = quantize_int4(w, 32)
    lin = nn.Linear(64, 16, bias=False)
    lin.weight.data.copy_(w)
    layer = Int4Linear.from_linear(lin, 32)
    deq = layer.dequantized_weight()
    s = scale.float().repeat_interleave(32, dim=1)
    assert bool(((deq - w).abs() <= s / 2 + 1e-3 * s + 1e-6).all())
    assert torch.equal(unpack_int4(layer.weight_packed), q)
    with pytest.raises(ValueError, match="group-size"):
        quantize_int4(w, 48)


def test_int4_cpu_kernel_agrees_with_the_dequantized_weight():
    torch.manual_seed(0)
    lin = nn.Linear(64, 32)
    layer = Int4Linear.from_linear(lin, 32)
    assert layer.cpu_kernel_fits
    x = torch.randn(3, 5, 64)
    ref = nn.functional.linear(x, layer.dequantized_weight(), layer.bias)
    with torch.no_grad():
        y = layer(x)
    assert y.shape == ref.shape and y.dtype == x.dtype
    assert torch.allclose(y, ref, atol=2e-2 * float(ref.abs().max()))  # bf16 activations
    # Loading other codes drops the cached kernel layout.
    other = Int4Linear.from_linear(nn.Linear(64, 32), 32)
    layer.load_state_dict(other.state_dict())
    with torch.no_grad():
        y2 = layer(x)
    ref2 = nn.functional.linear(x, other.dequantized_weight(), other.bias)
    assert torch.allclose(y2, ref2, atol=2e-2 * float(ref2.abs().max()))


def test_int8_embedding_rows():
    emb = nn.Embedding(10, 8)
    q = Int8Embedding.from_embedding(emb)
    idx = torch.tensor([[1, 9, 3]])
    step = emb.weight.abs().amax(1) / 127
    assert bool(((q(idx) - emb(idx)).abs() <= step[idx][..., None] / 2 + 1e-7).all())


@pytest.mark.parametrize("method", ["int8", "int4", "nf4"])
def test_every_block_linear_is_quantized_and_the_run_loads(gpt2_run, tiny_shards, tmp_path, method):
    if method == "nf4":
        pytest.importorskip("bitsandbytes")
    out = tmp_path / f"q_{method}"
    report = quantize_run(gpt2_run, QuantSpec(method, group_size=32), out, tiny_shards, max_eval_tokens=2048)
    model, _, doc, tok = load_for_inference(out, "cpu")
    assert doc["quantization"]["spec"]["method"] == method and tok is not None
    # No float linear left in the blocks; embeddings and head untouched without --quantize-embeddings.
    floats = [n for n, m in model.named_modules() if n.startswith("blocks.") and type(m) is nn.Linear]
    assert floats == []
    assert report["quantized_layers"] == 2 * 6  # q, k, v, o, up, down
    assert type(model.wte) is nn.Embedding and model.lm_head.weight is model.wte.weight
    expected_bits = {"int8": 8.0, "int4": 4 + 32 / 32, "nf4": 4 + 32 / 32}[method]
    assert report["bits_per_weight_quantized_layers"] == pytest.approx(expected_bits, rel=0.05)
    assert report["after"]["bytes"] < report["before"]["bytes"]
    # The reloaded run computes what the in-memory quantized model measured.
    from gptforge.eval.perplexity import evaluate_tokens
    from gptforge.export.calibration import read_split

    toks = read_split(tiny_shards, "val", 2049)
    r = evaluate_tokens(model, toks, stride=model.config.block_size)
    assert r.perplexity == pytest.approx(report["after"]["eval"]["perplexity"], rel=1e-5)
    change = abs(report["perplexity_change_percent"])
    assert change < {"int8": 2.0, "int4": 15.0, "nf4": 15.0}[method]


def test_quantize_embeddings_and_refusals(gpt2_run, tiny_shards, tmp_path):
    out = tmp_path / "q"
    quantize_run(gpt2_run, QuantSpec("int8", quantize_embeddings=True), out, tiny_shards, max_eval_tokens=512)
    model, *_ = load_for_inference(out, "cpu")
    assert isinstance(model.wte, Int8Embedding) and isinstance(model.lm_head, Int8Linear)
    ids = torch.tensor([[1, 2, 3]])
    assert model(ids).shape == (1, 3, model.config.vocab_size)
    # Generation (KV cache) and the server's loader work on a model without a float embedding.
    from gptforge.infer.generate import generate
    from gptforge.serve.app import load_model

    assert generate(model, ids, 4, temperature=0).shape == (1, 7)
    served, tok_file, _ = load_model(out, "cpu")
    assert isinstance(served.wte, Int8Embedding) and tok_file.is_file()
    assert torch.equal(generate(served, ids, 4, temperature=0), generate(model, ids, 4, temperature=0))
    with pytest.raises(InputError, match="already quantized"):
        quantize_run(out, QuantSpec("int4"), tmp_path / "qq", tiny_shards)
    with pytest.raises(InputError, match="inference only"):  # fine-tuning / conversion load this way
        load_model_checkpoint(out)
    with pytest.raises(InputError, match="group-size 48"):
        quantize_run(gpt2_run, QuantSpec("int4", group_size=48), tmp_path / "q48", tiny_shards)
    with pytest.raises(ValueError, match="already quantized"):
        quantize_model(model, QuantSpec("int8"))


def test_training_a_quantized_run_is_refused(gpt2_run, tiny_shards, tmp_path):
    from gptforge.runtime.checkpoint import find_checkpoint, load_checkpoint

    out = tmp_path / "q"
    quantize_run(gpt2_run, QuantSpec("int8"), out, tiny_shards, max_eval_tokens=512)
    model, *_ = load_for_inference(gpt2_run, "cpu")
    with pytest.raises(InputError, match="quantized"):
        load_checkpoint(find_checkpoint(out), model)
