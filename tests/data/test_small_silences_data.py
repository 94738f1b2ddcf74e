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

    from gptforge.data.phases.split import EmptyCorpusError
    from gptforge.data.prepare_sources import prepare_sources

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


def test_prepare_says_which_record_field_the_texts_came_from(tmp_path):
    import json

    from gptforge.data.prepare import summary_rows

    rng = random.Random(3)
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "a.jsonl", "w", encoding="utf-8") as f:
        for k in range(12):  # no "text" field: --text-field auto reads "content"
            f.write(json.dumps({"id": k, "content": " ".join(rng.choice(WORDS) for _ in range(60))}) + "\n")
        for k in range(3):
            f.write(json.dumps({"id": k, "text": " ".join(rng.choice(WORDS) for _ in range(60))}) + "\n")
    r = prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "out"), recipe="none", vocab_size=300,
                              workers=1), show_progress=False)
    assert r.read.text_fields == {"content": 12, "text": 3}
    rows = dict(summary_rows(r))
    line = rows["text read from field"]
    assert line.startswith("'content': 12 documents, 'text': 3 documents") and "--text-field auto" in line
    r2 = prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "out2"), recipe="none", vocab_size=300,
                               workers=1, text_field="content"), show_progress=False)
    assert dict(summary_rows(r2))["text read from field"] == "'content': 12 documents"
    src2 = tmp_path / "plain"
    src2.mkdir()
    (src2 / "a.txt").write_text("plain text " * 50, encoding="utf-8")
    r3 = prepare(PrepareConfig(inputs=[str(src2)], out=str(tmp_path / "out3"), recipe="none", vocab_size=300,
                               workers=1), show_progress=False)
    assert "text read from field" not in dict(summary_rows(r3))
