"""Progress lines of `gptforge export` when stderr is not a terminal, none under --quiet; the gguf
warning for matrices that q4_0 / q8_0 cannot take."""

from __future__ import annotations

import re

import pytest

from gptforge.cli import main


def test_export_gguf_prints_progress_lines_when_not_a_terminal(trained_runs, tmp_path, capsys):
    from gptforge.export.gguf import gguf_tensors
    from gptforge.runtime.loading import load_model_checkpoint

    n = len(gguf_tensors(load_model_checkpoint(trained_runs["llama"])[0]))
    assert main(["export", str(trained_runs["llama"]), "--format", "gguf", "--quantize", "q8_0",
                 "--out", str(tmp_path / "g")]) == 0
    err = capsys.readouterr().err  # pytest's capture is not a terminal: log lines
    lines = [ln for ln in err.splitlines() if ln.startswith("gptforge: gguf: converting tensors to q8_0:")]
    assert lines[0].endswith("started") and f"0/{n} tensors (0%)" in lines[0]
    assert lines[-1].startswith(f"gptforge: gguf: converting tensors to q8_0: {n}/{n} tensors (100%)")
    assert lines[-1].endswith("done")
    counts = [int(re.search(r": (\d+)/", ln).group(1)) for ln in lines]
    assert counts == sorted(counts) and len(lines) >= 4  # started, tenths, done
    assert any("ETA " in ln for ln in lines[1:-1])
    assert re.search(r"gptforge: loading .*: 1/1 models \(100%\)", err)
    assert re.search(r"gptforge: gguf: writing gptforge-q8_0\.gguf: 1/1 files", err)

    assert main(["export", str(trained_runs["llama"]), "--format", "gguf", "--out", str(tmp_path / "q"),
                 "--quiet"]) == 0
    assert "gptforge:" not in capsys.readouterr().err


def test_export_onnx_progress_names_its_steps(trained_runs, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    assert main(["export", str(trained_runs["gpt2"]), "--format", "onnx", "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert "gptforge: onnx export: 0/2 steps (0%)" in err and "tracing the model" in err
    assert re.search(r"gptforge: onnx export: 2/2 steps \(100%\).*done", err)


def test_gguf_q4_0_names_the_tensors_it_keeps_in_f16(tiny_shards, tmp_path):
    import gguf
    import torch

    from gptforge.config import ModelConfig
    from gptforge.export.gguf import write_gguf
    from gptforge.model.gpt import GPT

    torch.manual_seed(0)
    # d_ff 48: the rows of ffn_down (48 long) do not split into blocks of 32; every other matrix does.
    model = GPT(ModelConfig(preset="llama-nano", vocab_size=384, d_model=32, n_head=2, n_layer=2, d_ff=48,
                            block_size=32).resolved()).eval()
    with pytest.warns(UserWarning) as caught:
        path = write_gguf(model, tiny_shards, tmp_path / "m.gguf", quantize="q4_0")
    msg = " ".join(str(w.message) for w in caught)
    assert "--quantize q4_0: 2 of" in msg and "kept in f16" in msg and "not a multiple of the 32-value block" in msg
    assert "blk.0.ffn_down.weight [32, 48] (row of 48, 16 left over)" in msg and "blk.1.ffn_down.weight" in msg
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(str(path)).tensors}
    assert types["blk.0.ffn_down.weight"] == gguf.GGMLQuantizationType.F16
    assert types["blk.0.ffn_up.weight"] == gguf.GGMLQuantizationType.Q4_0
    assert "ffn_up" not in msg


def test_quantize_and_prune_print_their_steps_unless_quiet(gpt2_run, tiny_shards, tmp_path, capsys):
    assert main(["quantize", str(gpt2_run), "--method", "int8", "--calibration", str(tiny_shards),
                 "--max-eval-tokens", "256", "--out", str(tmp_path / "q")]) == 0
    err = capsys.readouterr().err
    assert "gptforge: quantize int8: 0/4 steps (0%)" in err and "measuring the original model" in err
    assert re.search(r"gptforge: quantize int8: 4/4 steps \(100%\).*done", err)
    assert re.search(r"gptforge: perplexity: \d+/\d+ windows", err)  # the before/after scoring, nested
    assert main(["prune", str(gpt2_run), "--calibration", str(tiny_shards), "--n-layer", "1",
                 "--calibration-batches", "2", "--out", str(tmp_path / "p")]) == 0
    err = capsys.readouterr().err
    assert re.search(r"gptforge: calibration pass: 2/2 batches \(100%\).*done", err)
    assert main(["prune", str(gpt2_run), "--sparsity", "0.5", "--out", str(tmp_path / "s"), "--quiet"]) == 0
    assert main(["quantize", str(gpt2_run), "--method", "int8", "--calibration", str(tiny_shards),
                 "--max-eval-tokens", "256", "--out", str(tmp_path / "q2"), "--quiet"]) == 0
    assert "gptforge:" not in capsys.readouterr().err
