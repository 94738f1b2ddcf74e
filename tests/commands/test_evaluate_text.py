"""`evaluate --text` refuses binary files and decodes UTF-16 (issue 15 item 5)."""

from __future__ import annotations

import json
import sys

import pytest

from gptforge.cli import main
from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.train.run import train


@pytest.fixture(scope="module")
def run(tiny_shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "run"
    cfg = RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32),
                    train=TrainConfig(max_steps=2, micro_batch_size=2, eval_interval=0, warmup_steps=1,
                                      tensorboard=False))
    train(cfg, tiny_shards, out, progress=False)
    return out


def test_binary_file_is_refused(run, capsys):
    assert main(["evaluate", str(run), "--text", sys.executable]) == 1
    assert "binary" in capsys.readouterr().err


def test_utf16_file_scores_like_its_utf8_twin(run, tmp_path, capsys):
    text = "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n" * 20
    u8, u16 = tmp_path / "a8.txt", tmp_path / "a16.txt"
    u8.write_text(text, encoding="utf-8")
    u16.write_text(text, encoding="utf-16")  # with a BOM
    results = []
    for path in (u8, u16):
        assert main(["evaluate", str(run), "--text", str(path), "--json"]) == 0
        results.append(json.loads(capsys.readouterr().out))
    assert results[0]["tokens"] == results[1]["tokens"] > 0
    assert results[0]["loss"] == pytest.approx(results[1]["loss"])
    raw = tmp_path / "le.txt"
    raw.write_bytes(text.encode("utf-16-le"))  # no BOM: refused as binary, read with --encoding
    assert main(["evaluate", str(run), "--text", str(raw)]) == 1
    assert "--encoding" in capsys.readouterr().err
    assert main(["evaluate", str(run), "--text", str(raw), "--encoding", "utf-16-le", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == results[0]["tokens"]


def test_crlf_text_scores_like_its_lf_twin(run, tmp_path, capsys):
    text = "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n" * 20
    lf, crlf = tmp_path / "lf.txt", tmp_path / "crlf.txt"
    lf.write_bytes(text.encode())
    crlf.write_bytes(text.replace("\n", "\r\n").encode())
    results = []
    for path in (lf, crlf):
        assert main(["evaluate", str(run), "--text", str(path), "--json"]) == 0
        results.append(json.loads(capsys.readouterr().out))
    assert results[0]["tokens"] == results[1]["tokens"] > 0
    assert results[0]["bits_per_byte"] == pytest.approx(results[1]["bits_per_byte"])
    assert results[1]["text_bytes"] == len(text.encode()) < results[1]["file_text_bytes"]
    assert "line ends LF" in results[1]["normalization"] and "NFC" in results[1]["normalization"]
    assert main(["evaluate", str(run), "--text", str(crlf)]) == 0
    out = capsys.readouterr().out
    assert "after normalization" in out and f"{len(text.encode()):,}" in out


def test_text_measurement_is_written_to_out_when_given(run, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 20)
    out = tmp_path / "ev" / "ppl.json"
    assert main(["evaluate", str(run), "--text", str(text), "--out", str(out)]) == 0
    saved = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert saved["tokens"] > 0 and saved["source"] == str(text) and f"{saved['loss']:.4f}" in printed
