"""Rerunning prepare onto a complete output says which recorded options differ from this call."""

from __future__ import annotations

import pytest

from gptforge.cli import main
from gptforge.data.prepare import PrepareConfig, prepare


@pytest.fixture(scope="module")
def done(tmp_path_factory, stdlib_texts):
    root = tmp_path_factory.mktemp("rerun")
    corpus = root / "corpus"
    corpus.mkdir()
    for i, text in enumerate(stdlib_texts[:6]):
        (corpus / f"doc{i}.txt").write_text(text, encoding="utf-8")
    out = root / "data"
    prepare(PrepareConfig(inputs=[str(corpus)], out=str(out), vocab_size=400, val_fraction=0.1, workers=1,
                          recipe="none"), show_progress=False)
    return corpus, out


def _argv(corpus, out, *extra):
    return ["prepare", str(corpus), "--out", str(out), "--val-fraction", "0.1", "--workers", "1",
            "--recipe", "none", "--no-progress", *extra]


def test_other_options_are_named_with_both_values(done, capsys):
    corpus, out = done
    assert main(_argv(corpus, out, "--vocab-size", "300", "--seed", "7")) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--vocab-size 400 (this call: 300)" in err and "--seed" in err and "--overwrite" in err
    assert "--val-fraction" not in err


def test_same_options_say_so_and_that_the_inputs_changed(done, capsys, tmp_path):
    corpus, out = done
    assert main(_argv(corpus, out, "--vocab-size", "400")) == 0  # unchanged: nothing to do
    assert "already complete" in capsys.readouterr().out
    extra = corpus / "doc_new.txt"
    extra.write_text("a new document that was not there before\n" * 20, encoding="utf-8")
    try:
        assert main(_argv(corpus, out, "--vocab-size", "400")) == 1
    finally:
        extra.unlink()
    err = capsys.readouterr().err
    assert "same options as this call" in err and "other options" not in err
