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


@pytest.mark.parametrize("mixture", [False, True])
def test_a_prepare_error_leaves_no_empty_folder_and_points_at_no_report(tmp_path, caplog, mixture):
    import logging

    from gptforge.data.prepare_sources import prepare_sources
    from gptforge.data.phases.split import EmptyCorpusError

    src = tmp_path / "src"
    src.mkdir()
    for k in range(3):  # a recipe with a langid step removes texts this short: nothing is left
        (src / f"{k}.txt").write_text(f"hi {k}", encoding="utf-8")
    out = tmp_path / "out"
    cfg = PrepareConfig(inputs=[] if mixture else [str(src)], out=str(out), recipe="web", vocab_size=300, workers=1)
    with caplog.at_level(logging.WARNING, logger="gptforge.data"), pytest.raises(EmptyCorpusError) as e:
        if mixture:
            prepare_sources(cfg, {"a": [str(src)], "b": [str(src)]}, show_progress=False)
        else:
            prepare(cfg, show_progress=False)
    assert "removed every remaining document" in str(e.value)
    assert not out.exists()
    assert not [r for r in caplog.records if "report.html" in r.getMessage()]
