"""`gptforge export --format triton` (config.pbtxt checked against the ONNX graph with Triton's own
ModelConfig protobuf), `--format hf` (the `convert --to-hf` code path), and the bad-input cases."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gptforge.cli import main
from gptforge.runtime.loading import load_model_checkpoint

from .conftest import val_tokens


def test_triton_repository_matches_the_onnx_graph(trained_runs, tmp_path, tiny_shards):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    mc = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from google.protobuf import text_format

    from gptforge.export.onnx import OnnxDecoder

    repo = tmp_path / "repo"
    assert main(["export", str(trained_runs["llama"]), "--format", "triton", "--name", "tiny", "--out", str(repo),
                 "--max-batch-size", "4", "--instances", "2", "--instance-kind", "KIND_CPU"]) == 0
    assert (repo / "README.md").is_file() and (repo / "tiny" / "1" / "model.onnx").is_file()
    cfg = text_format.Parse((repo / "tiny" / "config.pbtxt").read_text(), mc.ModelConfig())
    assert cfg.name == "tiny" and cfg.backend == "onnxruntime" and cfg.max_batch_size == 4
    assert cfg.HasField("dynamic_batching")
    assert cfg.instance_group[0].count == 2 and cfg.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU

    graph = onnx.load(str(repo / "tiny" / "1" / "model.onnx")).graph
    onnx_to_triton = {onnx.TensorProto.INT64: mc.TYPE_INT64, onnx.TensorProto.FLOAT: mc.TYPE_FP32}

    def check(triton_list, onnx_list):
        assert [t.name for t in triton_list] == [o.name for o in onnx_list]
        for t, o in zip(triton_list, onnx_list, strict=True):
            assert t.data_type == onnx_to_triton[o.type.tensor_type.elem_type], t.name
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in o.type.tensor_type.shape.dim]
            assert dims[0] == -1 and list(t.dims) == dims[1:], t.name  # Triton owns the batch dim

    check(cfg.input, graph.input)
    check(cfg.output, graph.output)
    assert len(cfg.input) == 3 + 2 * 2 and list(cfg.input[3].dims) == [2, -1, 8]
    # The repository's model runs (onnxruntime, the backend Triton loads it with).
    ids = val_tokens(tiny_shards, 16).reshape(2, 8)
    logits, _ = OnnxDecoder(repo / "tiny" / "1").run(ids)
    model, _ = load_model_checkpoint(trained_runs["llama"])
    with torch.no_grad():
        np.testing.assert_allclose(logits, model(torch.from_numpy(ids)).numpy(), atol=1e-4, rtol=0)


def test_export_hf_is_convert_to_hf(trained_runs, tmp_path):
    from safetensors.numpy import load_file

    run = trained_runs["gpt2"]
    assert main(["export", str(run), "--format", "hf", "--out", str(tmp_path / "a")]) == 0
    assert main(["convert", "--to-hf", str(run), "--out", str(tmp_path / "b")]) == 0
    names = sorted(p.name for p in (tmp_path / "a").iterdir() if p.name != ".gptforge-export")
    assert (tmp_path / "a" / ".gptforge-export").is_file()  # export's mark (issue 41 item 6)
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in names:
        if name.endswith(".safetensors"):
            a, b = load_file(tmp_path / "a" / name), load_file(tmp_path / "b" / name)
            assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
        else:
            assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    # An HF folder as the source, written again in another dtype by the same writer.
    assert main(["export", str(tmp_path / "a"), "--format", "hf", "--dtype", "f16", "--out", str(tmp_path / "c")]) == 0
    c = load_file(tmp_path / "c" / "model.safetensors")
    assert all(v.dtype == np.float16 for v in c.values())
    config = json.loads((tmp_path / "c" / "config.json").read_text())
    # What vLLM reads from a Hugging Face folder.
    assert config["architectures"] == ["GPT2LMHeadModel"] and config["n_positions"] == 64
    assert config.get("torch_dtype", config.get("dtype")) == "float16"
    assert json.loads((tmp_path / "c" / "generation_config.json").read_text())["eos_token_id"] == 0


def test_export_bad_input(trained_runs, tmp_path, capsys, monkeypatch):
    run = trained_runs["gpt2"]
    with pytest.raises(SystemExit):
        main(["export", str(run), "--format", "tflite", "--out", str(tmp_path / "x")])
    assert "tflite" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["export", str(tmp_path / "empty"), "--format", "onnx", "--out", str(tmp_path / "x")]) == 1
    assert "checkpoints/latest" in capsys.readouterr().err
    (tmp_path / "exists").mkdir()
    assert main(["export", str(run), "--format", "gguf", "--out", str(tmp_path / "exists")]) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert main(["export", str(run), "--format", "onnx", "--dtype", "bf16", "--out", str(tmp_path / "x")]) == 2  # USAGE_EXIT
    assert "--dtype bf16 cannot be written in the onnx format" in capsys.readouterr().err
    assert main(["export", str(run), "--format", "hf", "--quantize", "q8_0", "--out", str(tmp_path / "x")]) == 2
    assert "--quantize q8_0 cannot be written in the hf format" in capsys.readouterr().err
    assert main(["export", str(run), "--format", "onnx", "--quantize", "q4_0", "--out", str(tmp_path / "x")]) == 2
    assert "in the onnx format: it offers int8" in capsys.readouterr().err

    # A failure halfway leaves neither the folder nor its staging folder.
    import gptforge.export.gguf as g

    def broken(*a, **k):
        raise OSError(28, "No space left on device", str(tmp_path / "x"))

    monkeypatch.setattr(g, "gguf_tensors", broken)
    assert main(["export", str(run), "--format", "gguf", "--out", str(tmp_path / "x")]) == 1
    assert "No space left" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".x.tmp*"))
    # --overwrite keeps the old folder when the new export fails.
    (tmp_path / "exists" / "keep").write_text("old")
    assert main(["export", str(run), "--format", "gguf", "--overwrite", "--out", str(tmp_path / "exists")]) == 1
    assert (tmp_path / "exists" / "keep").read_text() == "old"
