"""prepare -> pretrain 30 steps -> evaluate -> generate, through the command line entry point."""

import json

import numpy as np
import pytest
import torch
import yaml

from gptforge.cli import main
from gptforge.data.shards import load_meta
from gptforge.runtime.checkpoint import find_checkpoint
from gptforge.runtime.loading import load_for_inference
from gptforge.train.loggers import read_metrics
from tests.conftest import stdlib_sample_files


@pytest.mark.slow
def test_prepare_pretrain_evaluate_generate(tmp_path, capsys):
    data, run = tmp_path / "data", tmp_path / "run"
    files = [str(p) for p in stdlib_sample_files(30)]
    assert main(["prepare", *files, "--out", str(data), "--vocab-size", "320", "--val-fraction", "0.15",
                 "--workers", "1"]) == 0
    meta = load_meta(data)
    for split in ("train", "val"):
        s = meta["splits"][split]
        assert s["tokens"] > 0 and s["documents"] > 0 and s["bytes"] > s["documents"]
        arr = np.concatenate([np.memmap(data / f, dtype=meta["dtype"], mode="r") for f in s["files"]])
        assert len(arr) == s["tokens"] and arr.max() < meta["vocab_size"]
        assert (arr == meta["eos_id"]).sum() == s["documents"]  # one EOS after every document
    assert (data / "tokenizer.json").exists()

    rc = main(["pretrain", "--data", str(data), "--out", str(run), "--model.preset", "gpt2-nano",
               "--model.block_size", "64", "--train.max_steps", "30", "--train.micro_batch_size", "8",
               "--train.lr", "3e-3", "--train.warmup_steps", "5", "--train.eval_interval", "10",
               "--train.eval_steps", "4", "--train.checkpoint_interval", "15", "--quiet"])
    assert rc == 0
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == list(range(1, 31))
    for key in ("loss", "lr", "grad_norm", "tokens_per_second", "mfu", "peak_memory_bytes", "predicted_memory_bytes"):
        assert key in rows[0]
    vals = [r["val_loss"] for r in rows if "val_loss" in r]
    assert len(vals) == 3 and vals[-1] < vals[0] - 0.1 < rows[0]["loss"]
    assert rows[0]["tokens_per_second"] > 0 and 0 < rows[0]["mfu"] < 1 and rows[0]["predicted_memory_bytes"] > 0
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["model"]["vocab_size"] == meta["vocab_size"] and cfg["model"]["n_layer"] == 2
    assert cfg["versions"]["torch"] == str(torch.__version__) and len(cfg["data"]["meta_sha256"]) == 64
    assert (run / "tb").is_dir() and any((run / "tb").iterdir())
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_0000030"
    assert (run / "checkpoints" / "best").exists()
    model, ckpt, _doc, tok = load_for_inference(run)
    assert ckpt == find_checkpoint(run) and tok is not None

    capsys.readouterr()
    assert main(["evaluate", str(run), "--data", str(data), "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["tokens"] == meta["splits"]["val"]["tokens"] - 1
    assert abs(ev["loss"] - vals[-1]) < 0.5 and ev["bits_per_byte"] > 0

    text = tmp_path / "t.txt"
    text.write_text("def add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\"\n    return a + b\n")
    assert main(["evaluate", str(run), "--text", str(text), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bits_per_byte"] > 0

    assert main(["generate", str(run), "--prompt", "def ", "--max-new-tokens", "20", "--temperature", "0"]) == 0
    greedy = capsys.readouterr().out
    assert greedy.startswith("def ") and len(greedy) > 5
    assert main(["generate", str(run), "--prompt", "def ", "--max-new-tokens", "20", "--temperature", "0",
                 "--no-cache"]) == 0
    assert capsys.readouterr().out == greedy


def test_bad_inputs_give_clear_errors(tmp_path, capsys, tiny_shards):
    assert main(["pretrain", "--data", str(tmp_path / "nope"), "--out", str(tmp_path / "r"), "--quiet"]) == 1
    assert "nope" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["pretrain", "--data", str(tiny_shards), "--out", str(tmp_path / "r"), "--train.lrr", "1"])
    assert e.value.code == 2 and "--train.lr" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path / "none"), "--data", str(tiny_shards)]) == 1
    assert "no complete checkpoint" in capsys.readouterr().err
    assert main(["frobnicate"]) == 2
