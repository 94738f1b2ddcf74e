"""Contamination: token n-grams of evaluation examples found in the training split, streamed in chunks."""

import json

import numpy as np
import pytest

from gptforge.cli import main
from gptforge.data.shards import load_meta
from gptforge.data.tokenizer import Tokenizer
from gptforge.eval.contamination import find_contamination, ngram_hashes


def test_ngram_hashes_match_equal_windows_only():
    t = np.array([5, 0, 7, 5, 0, 7, 1])
    h = ngram_hashes(t, 3)
    assert len(h) == 5 and h[0] == h[3] and len(set(h.tolist())) == 4
    assert len(ngram_hashes(t, 8)) == 0
    assert ngram_hashes(np.array([0, 0, 1]), 2)[0] != ngram_hashes(np.array([0, 1]), 2)[0]


@pytest.mark.parametrize("chunk", [7, 1000, 1 << 22])
def test_examples_from_the_train_split_are_found_whatever_the_chunk_size(tiny_shards, chunk):
    meta = load_meta(tiny_shards)
    train = np.memmap(tiny_shards / meta["splits"]["train"]["files"][0], dtype=meta["dtype"], mode="r")
    copied = train[1000:1040].tolist()  # 40 tokens straight from the training data
    rng = np.random.default_rng(0)
    fresh = rng.integers(1, meta["vocab_size"], size=40).tolist()  # random ids: no 13-gram in common
    tail = train[len(train) - 13:].tolist()  # the very last 13-gram (crosses no chunk end unnoticed)
    rep = find_contamination({"t": [copied, fresh, tail, copied[:5]]}, tiny_shards, n=13, chunk_tokens=chunk)
    assert rep.contaminated["t"] == [0, 2]
    assert rep.too_short["t"] == 1
    assert rep.train_tokens == sum(
        len(np.memmap(tiny_shards / f, dtype=meta["dtype"], mode="r")) for f in meta["splits"]["train"]["files"])


def test_evaluate_contamination_reports_clean_scores(trained_run, tiny_shards, tmp_path, capsys):
    tok = Tokenizer.from_file(tiny_shards / "tokenizer.json")
    meta = load_meta(tiny_shards)
    train = np.memmap(tiny_shards / meta["splits"]["train"]["files"][0], dtype=meta["dtype"], mode="r")
    leaked = tok.decode(train[5000:5060].tolist())
    rows = [{"context": leaked, "choices": ["x", "y"], "label": 0},
            {"context": "zq vx wk " * 10, "choices": ["x", "y"], "label": 1},
            {"context": "qz kw xv " * 10, "choices": ["x", "y"], "label": 0}]
    task = tmp_path / "leak.jsonl"
    task.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "r.json"
    assert main(["evaluate", str(trained_run), "--tasks", str(task), "--contamination", str(tiny_shards),
                 "--out", str(out)]) == 0
    assert "1 of 3 examples share a 13-gram" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["contamination"]["tasks"]["leak"]["examples"] == [0]
    assert doc["contamination"]["tasks"]["leak"]["lines"] == [1]
    clean = doc["tasks"]["leak"]["clean"]
    assert clean["n"] == 2 and clean["metrics"]["acc"]["n"] == 2
