"""`plan --data A B --data-weights ...`: tokens and epochs per source of a mixture (issue 25 item 6)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gptforge.plan.mixture import format_budget, mixture_budget


def test_budget_per_source_and_the_repetition_warning(tiny_shards, tmp_path):
    (tmp_path / "b").symlink_to(tiny_shards, target_is_directory=True)  # a second source of the same size
    n = json.loads((tiny_shards / "meta.json").read_text())["splits"]["train"]["tokens"]
    rows = mixture_budget([str(tiny_shards), str(tmp_path / "b")], {"data": 3, "b": 1}, 10 * n)
    assert [(r.name, r.weight, r.train_tokens) for r in rows] == [("data", 0.75, n), ("b", 0.25, n)]
    assert [r.epochs for r in rows] == pytest.approx([7.5, 2.5])
    text = format_budget(rows)
    assert "WARNING: data repeats 7.5 epochs" in text and "WARNING: b" not in text
    even = mixture_budget([str(tiny_shards), str(tmp_path / "b")], None, 2 * n)
    assert [r.weight for r in even] == [0.5, 0.5]
    with pytest.raises(ValueError, match="one source"):
        mixture_budget(str(tiny_shards), None, n)
    out = subprocess.run([sys.executable, "-m", "gptforge.cli", "plan", "--model", "gpt2-mini", "--tokens", "1M",
                          "--data", str(tiny_shards), str(tmp_path / "b"), "--data-weights", "data=0.9,b=0.1",
                          "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    mix = json.loads(out.stdout)["mixture"]
    assert [m["name"] for m in mix] == ["data", "b"] and mix[0]["tokens"] == pytest.approx(0.9e6)


def test_train_data_weights_is_the_same_option_as_the_shortcut(tiny_shards, tmp_path, capsys):
    from gptforge.cli import main

    (tmp_path / "b").symlink_to(tiny_shards, target_is_directory=True)
    base = ["plan", "--model", "gpt2-mini", "--tokens", "1M", "--data", str(tiny_shards), str(tmp_path / "b"), "--json"]
    mixes = []
    for spelling in (["--data-weights", "data=0.9,b=0.1"], ["--train.data_weights", '{"data": 0.9, "b": 0.1}']):
        assert main([*base, *spelling]) == 0
        mixes.append([(m["name"], round(m["tokens"])) for m in json.loads(capsys.readouterr().out)["mixture"]])
    assert mixes[0] == mixes[1] == [("data", 900_000), ("b", 100_000)]
