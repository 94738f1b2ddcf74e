"""A single-file corpus gets a val split by position inside the document (issue 18 item 1)."""

from __future__ import annotations

import numpy as np

from gptforge.data.prepare import PrepareConfig, prepare, summary_rows
from gptforge.data.shards import load_meta, load_tokenizer, open_split


def _text(out, split):
    tok = load_tokenizer(out)
    maps = open_split(out, split)
    ids = np.concatenate(maps).tolist() if maps else []
    assert not ids or ids[-1] == tok.eos_id
    return tok.decode([i for i in ids if i != tok.eos_id])


def test_one_file_gets_a_val_split_from_its_end(tmp_path, stdlib_texts, caplog):
    text = "\n".join(stdlib_texts[:20])
    src = tmp_path / "input.txt"
    src.write_text(text, encoding="utf-8")
    out = tmp_path / "data"
    with caplog.at_level("WARNING", logger="gptforge.data"):
        r = prepare(PrepareConfig(inputs=[str(src)], out=str(out), vocab_size=400, val_fraction=0.1, workers=1,
                                  recipe="none"), show_progress=False)
    meta = load_meta(out)
    train, val = meta["splits"]["train"], meta["splits"]["val"]
    assert val["documents"] == 1 and train["documents"] == 1
    share = val["bytes"] / (val["bytes"] + train["bytes"])
    assert 0.08 < share < 0.2, share
    # nothing lost or duplicated: train then val is the file's text
    assert _text(out, "train") + _text(out, "val") == text
    assert "position" in caplog.text and "val" in caplog.text
    assert meta["prepare_config"]["position_split"]
    assert r.report["check"]["adds_up"]
    assert not any(label == "WARNING" for label, _ in summary_rows(r))  # "no val split" is gone


def test_val_and_test_from_one_document_and_a_minimum_size(tmp_path, stdlib_texts):
    text = "\n".join(stdlib_texts[:20])
    src = tmp_path / "input.txt"
    src.write_text(text, encoding="utf-8")
    out = tmp_path / "data"
    prepare(PrepareConfig(inputs=[str(src)], out=str(out), vocab_size=400, val_fraction=0.001, test_fraction=0.001,
                          workers=1, recipe="none"), show_progress=False)
    meta = load_meta(out)
    for split in ("val", "test"):
        assert meta["splits"][split]["documents"] == 1
        assert meta["splits"][split]["tokens"] > 1000  # a few context windows, not 0.1% of the text
    assert _text(out, "train") + _text(out, "val") + _text(out, "test") == text


def test_many_documents_keep_the_by_document_split(tmp_path, stdlib_texts):
    src = tmp_path / "src"
    src.mkdir()
    for i, t in enumerate(stdlib_texts[:20]):
        (src / f"{i}.txt").write_text(t, encoding="utf-8")
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "data"), vocab_size=400, val_fraction=0.1,
                          workers=1, recipe="none"), show_progress=False)
    meta = load_meta(tmp_path / "data")
    assert not meta["prepare_config"].get("position_split")
    assert sum(meta["splits"][s]["documents"] for s in ("train", "val", "test")) == 20


def test_a_single_document_that_hashes_into_val_still_trains(tmp_path, stdlib_texts):
    from gptforge.data.prepare import assign_split

    src = tmp_path / "input.txt"
    src.write_text("\n".join(stdlib_texts[:20]), encoding="utf-8")
    from gptforge.data.phases.split import split_key

    doc_key = split_key(src.read_text(encoding="utf-8"))  # a document's split key: a hash of its text
    seed = next(s for s in range(10_000) if assign_split(doc_key, s, 0.1, 0.0) == "val")
    out = tmp_path / "data"
    prepare(PrepareConfig(inputs=[str(src)], out=str(out), vocab_size=400, val_fraction=0.1, workers=1,
                          recipe="none", seed=seed), show_progress=False)
    meta = load_meta(out)
    assert meta["splits"]["train"]["documents"] == 1 and meta["splits"]["val"]["documents"] == 1
    assert meta["splits"]["train"]["tokens"] > meta["splits"]["val"]["tokens"] > 0
