"""Smaller things that were said wrongly or not at all (issue 41 item 7), data side."""

from __future__ import annotations

import random

import pytest

from gptforge.data.prepare import PrepareConfig, prepare

WORDS = "the river city garden market school teacher children morning winter summer bridge station".split()


def _src(root):
    rng = random.Random(2)
    d = root / "src"
    d.mkdir()
    for k in range(12):
        (d / f"{k}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(100)) + ".", encoding="utf-8")
    return d


def test_rerun_refusal_shows_the_auto_vocabulary_size_chosen(tmp_path):
    src = _src(tmp_path)
    first = prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "out"), recipe="none", workers=1),
                    show_progress=False)
    with pytest.raises(FileExistsError) as e:
        prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "out"), recipe="none", workers=1, vocab_size=600),
                show_progress=False)
    assert f"--vocab-size 0 (auto: {first.meta['vocab_size']}) (this call: 600)" in str(e.value)
