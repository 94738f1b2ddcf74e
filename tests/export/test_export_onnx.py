"""`gptforge export --format onnx`: the decoder graph checked by onnxruntime against torch."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from gptforge.cli import main  # noqa: E402
from gptforge.export.onnx import OnnxDecoder  # noqa: E402
from gptforge.infer.generate import generate  # noqa: E402
from gptforge.runtime.loading import load_model_checkpoint  # noqa: E402

from .conftest import val_tokens  # noqa: E402

ARCHS = ["llama", "qwen3", "gpt2"]


def _torch_model(run):
    model, _ = load_model_checkpoint(run)
    return model.float().eval()


@pytest.mark.parametrize("arch", ARCHS)
def test_onnx_logits_match_torch_at_several_shapes(arch, trained_runs, onnx_exports, tiny_shards):
    model = _torch_model(trained_runs[arch])
    dec = OnnxDecoder(onnx_exports[arch])
    toks = val_tokens(tiny_shards, 4 * 40)
    # (batch, prompt length, then tokens fed against that past): prefill with past 0, batch > 1, past > 0,
    # single-token decoding steps.
    for B, P, T in [(1, 7, 0), (3, 12, 0), (2, 6, 5), (3, 9, 1), (4, 30, 10)]:
        ids = torch.from_numpy(toks[: B * (P + T)].reshape(B, P + T))
        with torch.no_grad():
            ref = model(ids).numpy()
        logits, past = dec.run(ids[:, :P].numpy())
        assert all(p.shape == (B, model.config.n_kv_head, P, model.config.head_dim) for p in past)
        np.testing.assert_allclose(logits, ref[:, :P], atol=1e-4, rtol=0)
        if T:
            logits2, past2 = dec.run(ids[:, P:].numpy(), past)
            assert past2[0].shape[2] == P + T
            np.testing.assert_allclose(logits2, ref[:, P:], atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_onnx_left_padded_batch_equals_unpadded_rows(arch, trained_runs, onnx_exports, tiny_shards):
    model = _torch_model(trained_runs[arch])
    dec = OnnxDecoder(onnx_exports[arch])
    toks = val_tokens(tiny_shards, 40)
    short, long = toks[:6], toks[6:16]
    ids = np.stack([np.concatenate([np.zeros(4, np.int64), short]), long])
    mask = np.array([[0] * 4 + [1] * 6, [1] * 10])
    pos = np.stack([np.concatenate([np.zeros(4, np.int64), np.arange(6)]), np.arange(10)])
    logits, _ = dec.run(ids, attention_mask=mask, position_ids=pos)
    with torch.no_grad():
        ref_short = model(torch.from_numpy(short)[None]).numpy()[0]
        ref_long = model(torch.from_numpy(long)[None]).numpy()[0]
    np.testing.assert_allclose(logits[0, 4:], ref_short, atol=1e-4, rtol=0)
    np.testing.assert_allclose(logits[1], ref_long, atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_onnx_greedy_continuation_equals_gptforge(arch, trained_runs, onnx_exports, tiny_shards):
    model = _torch_model(trained_runs[arch])
    prompt = val_tokens(tiny_shards, 12).tolist()
    ours = generate(model, torch.tensor([prompt]), 20, temperature=0)[0].tolist()
    theirs = OnnxDecoder(onnx_exports[arch]).greedy(prompt, 20)
    assert theirs == ours
    # Decided by clear margins (a trained model), not by near-tied logits.
    with torch.no_grad():
        top2 = model(torch.tensor([ours[:-1]]))[0, 11:].topk(2, dim=-1).values
    assert float((top2[:, 0] - top2[:, 1]).min()) > 1e-3


def test_onnx_folder_layout_and_io_json(trained_runs, onnx_exports):
    folder = onnx_exports["llama"]
    names = sorted(p.name for p in folder.iterdir())
    assert {"model.onnx", "onnx_io.json", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json"} <= set(names)
    proto = onnx.load(str(folder / "model.onnx"))
    assert max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")) >= 17
    spec = json.loads((folder / "onnx_io.json").read_text())
    graph_inputs = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
                    for i in proto.graph.input}
    assert [e["name"] for e in spec["inputs"]] == list(graph_inputs)
    for e in spec["inputs"]:
        assert graph_inputs[e["name"]] == e["dims"]
    assert graph_inputs["past_key_values.1.value"] == ["batch", 2, "past_sequence", 8]
    assert spec["outputs"][0] == {"name": "logits", "dtype": "float32", "dims": ["batch", "sequence", 384]}
    assert spec["model"]["n_layer"] == 2 and spec["model"]["eos_token_id"] == 0
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.eos_token_id == 0


def test_onnx_f16_external_data_and_int8(trained_runs, onnx_exports, tmp_path, tiny_shards, capsys, monkeypatch):
    """f16 (with the weights in model.onnx.data, as models near 2 GB are written) runs in onnxruntime
    close to torch; int8 dynamic quantization keeps the perplexity close."""
    import gptforge.export.onnx as gx

    run = trained_runs["gpt2"]
    model = _torch_model(run)
    f16 = tmp_path / "f16"
    monkeypatch.setattr(gx, "EXTERNAL_DATA_BYTES", 0)
    assert main(["export", str(run), "--format", "onnx", "--dtype", "f16", "--out", str(f16)]) == 0
    assert (f16 / "model.onnx.data").stat().st_size > 50_000  # the larger matrices moved out
    monkeypatch.undo()
    toks = val_tokens(tiny_shards, 2 * 64)
    ids = toks.reshape(2, 64)
    logits16, past = OnnxDecoder(f16).run(ids)
    assert logits16.dtype == np.float16 and past[0].dtype == np.float16
    with torch.no_grad():
        ref = model(torch.from_numpy(ids)).numpy()
    assert np.abs(logits16.astype(np.float32) - ref).max() < 5e-2

    q = tmp_path / "int8"
    assert main(["export", str(run), "--format", "onnx", "--quantize", "int8", "--out", str(q)]) == 0
    assert (q / "model.onnx").stat().st_size < 0.75 * (onnx_exports["gpt2"] / "model.onnx").stat().st_size
    inits = onnx.load(str(q / "model.onnx")).graph.initializer
    assert sum(i.data_type == onnx.TensorProto.INT8 for i in inits) >= 2 * 4  # q/k/v/o, up/down per layer
    logits8, _ = OnnxDecoder(q).run(ids)

    def ppl(logits):
        lp = torch.log_softmax(torch.from_numpy(logits[:, :-1].astype(np.float32)), -1)
        nll = -lp.gather(-1, torch.from_numpy(ids[:, 1:])[..., None]).mean()
        return float(nll.exp())

    p32, p8 = ppl(ref), ppl(logits8)
    with capsys.disabled():
        print(f"\nperplexity on {ids.size} val tokens: torch f32 {p32:.3f}, onnx int8 {p8:.3f} "
              f"({100 * (p8 / p32 - 1):+.2f}%)")
    assert abs(p8 / p32 - 1) < 0.05
    assert json.loads((q / "onnx_io.json").read_text())["quantization"].startswith("int8")
