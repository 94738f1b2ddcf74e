"""`gptforge quantize` and `gptforge prune` as a user runs them: output lines and one-line errors."""

from gptforge.cli import main


def test_quantize_command(gpt2_run, tiny_shards, tmp_path, capsys):
    out = tmp_path / "q"
    assert main(["quantize", str(gpt2_run), "--method", "int4", "--group-size", "32", "--calibration",
                 str(tiny_shards), "--max-eval-tokens", "512", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "bits/weight    5.00 in the quantized layers" in text and "val perplexity" in text
    assert main(["evaluate", str(out), "--data", str(tiny_shards), "--max-tokens", "256"]) == 0
    assert main(["generate", str(out), "--prompt", "def ", "--max-new-tokens", "4"]) == 0
    capsys.readouterr()
    assert main(["quantize", str(out), "--method", "int8", "--out", str(tmp_path / "qq")]) == 1
    assert "gptforge quantize: error:" in capsys.readouterr().err
    assert main(["export", str(out), "--format", "gguf", "--out", str(tmp_path / "g")]) == 1
    assert "quantized (int4)" in capsys.readouterr().err


def test_prune_command(gpt2_run, tiny_shards, tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["prune", str(gpt2_run), "--calibration", str(tiny_shards), "--n-layer", "1", "--d-ff", "64",
                 "--calibration-batches", "2", "--out", str(out)]) == 0
    assert "n_layer 1" in capsys.readouterr().out
    assert main(["evaluate", str(out), "--data", str(tiny_shards), "--max-tokens", "256"]) == 0
    capsys.readouterr()
    assert main(["prune", str(gpt2_run), "--calibration", str(tiny_shards), "--target-params", "1000",
                 "--d-ff", "8", "--out", str(tmp_path / "x")]) == 1
    assert "--target-params excludes" in capsys.readouterr().err
    assert main(["prune", str(gpt2_run), "--calibration", str(tiny_shards), "--heads-per-layer", "3",
                 "--out", str(tmp_path / "x")]) == 1
    assert "--heads-per-layer 3" in capsys.readouterr().err


def test_prune_sparsity_command(gpt2_run, tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["prune", str(gpt2_run), "--sparsity", "0.3", "--out", str(out)]) == 0
    assert "stored dense" in capsys.readouterr().out
    from gptforge.runtime.loading import load_for_inference

    model, *_ = load_for_inference(out, "cpu")
    w = model.blocks[0].attn.q_proj.weight
    assert 0.05 < float((w == 0).float().mean()) < 0.6
    assert main(["prune", str(gpt2_run), "--out", str(tmp_path / "x"), "--n-layer", "1"]) == 1
    assert "--calibration" in capsys.readouterr().err


def test_export_refuses_an_out_that_holds_the_source(tiny_shards, tmp_path, capsys):
    """`export RUN --out RUN --overwrite` (hf) and `--out <parent of RUN> --overwrite` (gguf)
    deleted the run they exported from."""
    from tests.export.conftest import train_tiny

    run = train_tiny(tiny_shards, tmp_path / "proj" / "run", "gpt2", steps=2)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    assert (run / "config.yaml").is_file() and (run / "metrics.jsonl").is_file()
    for fmt, out in (("hf", run), ("gguf", run.parent), ("hf", tmp_path)):
        assert main(["export", str(run), "--format", fmt, "--out", str(out), "--overwrite"]) == 1
        err = capsys.readouterr().err
        assert "holds the input" in err and "--out" in err
        assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
    assert main(["export", str(run), "--format", "hf", "--out", str(run / "hf")]) == 0  # inside the run is fine
    assert (run / "hf" / "config.json").is_file() and (run / "config.yaml").is_file()


def test_evaluate_on_an_empty_split_says_how_to_get_one(gpt2_run, tiny_shards, capsys):
    assert main(["evaluate", str(gpt2_run), "--data", str(tiny_shards), "--split", "test"]) != 0
    err = capsys.readouterr().err
    assert "split 'test' is empty; prepare it with that split (`gptforge prepare ... --test-fraction 0.01`)" in err
    assert "or use --split train" in err or "or use --split val" in err
