"""Numeric options of evaluate and generate are range-checked at parse time, naming the option and
its range (before any model is loaded: the model path need not exist)."""

from __future__ import annotations

import pytest

from gptforge.cli import main


@pytest.mark.parametrize("command,args,expected", [
    ("evaluate", ["--text", "t.txt", "--stride", "0"], "--stride must be >= 1, got 0"),
    ("evaluate", ["--text", "t.txt", "--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    ("evaluate", ["--text", "t.txt", "--max-tokens", "1"], "--max-tokens must be >= 2, got 1"),
    ("evaluate", ["--tasks", "t.jsonl", "--num-fewshot", "-1"], "--num-fewshot must be >= 0, got -1"),
    ("evaluate", ["--tasks", "t.jsonl", "--limit", "0"], "--limit must be >= 1, got 0"),
    ("evaluate", ["--tasks", "t.jsonl", "--contamination-ngram", "0"], "--contamination-ngram must be >= 1"),
    ("generate", ["--top-p", "0"], "--top-p must be in (0, 1], got 0.0"),
    ("generate", ["--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5"),
    ("generate", ["--top-k", "0"], "--top-k must be >= 1, got 0"),
    ("generate", ["--num-samples", "0"], "--num-samples must be >= 1, got 0"),
    ("generate", ["--max-new-tokens", "-1"], "--max-new-tokens must be >= 0, got -1"),
    ("generate", ["--temperature", "-0.5"], "--temperature must be >= 0, got -0.5"),
])
def test_out_of_range_option_is_refused_by_name(command, args, expected, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, str(tmp_path / "no-such-run"), *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"gptforge {command}: error: {expected}" in err and "Traceback" not in err


def test_ranges_show_in_help(capsys):
    with pytest.raises(SystemExit):
        main(["evaluate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(must be >= 1)" in out and "--stride" in out


def test_in_range_values_pass_the_parse(tmp_path, capsys):
    # Parsing succeeds; the command then fails on the missing model, not on an option.
    rc = main(["generate", str(tmp_path / "no-such-run"), "--top-p", "1", "--max-new-tokens", "0"])
    assert rc == 1 and "must be" not in capsys.readouterr().err


@pytest.mark.parametrize("args,expected", [
    (["--max-model-len", "-5"], "--max-model-len must be >= 1, got -5"),
    (["--max-batch-size", "0"], "--max-batch-size must be >= 1, got 0"),
    (["--port", "70000"], "--port must be in [1, 65535], got 70000"),
])
def test_serve_numbers_are_checked_before_anything_loads(args, expected, tmp_path, capsys):
    # The model path does not exist: a check after loading would report the path instead.
    with pytest.raises(SystemExit) as e:  # the fields' ranges: the parser refuses, USAGE_EXIT
        main(["serve", str(tmp_path / "no-such-run"), *args])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == f"gptforge serve: error: {expected}"
