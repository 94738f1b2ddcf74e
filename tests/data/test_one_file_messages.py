"""prepare on one concatenated file: the summary does not count kept > read, a --doc-separator that
never occurs is named as such, and an empty --doc-separator is refused."""

from __future__ import annotations

import pytest

from gptforge.data.prepare import PrepareConfig, prepare, summary_rows


def _one_file(tmp_path, stdlib_texts):
    src = tmp_path / "milton_all.txt"
    src.write_text("\n".join(stdlib_texts[:20]), encoding="utf-8")
    return src


def test_summary_counts_position_split_pieces_apart(tmp_path, stdlib_texts):
    src = _one_file(tmp_path, stdlib_texts)
    r = prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "data"), vocab_size=400, val_fraction=0.1,
                              workers=1, recipe="none"), show_progress=False)
    rows = dict(summary_rows(r))
    assert rows["documents read"] == "1" and rows["documents kept"] == "1"
    assert rows["pieces written"].startswith("2 (1 document(s) cut by position into 2 ")


def test_separator_not_found_is_said(tmp_path, stdlib_texts, caplog):
    src = _one_file(tmp_path, stdlib_texts)
    with caplog.at_level("WARNING", logger="gptforge.data"):
        prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "data"), vocab_size=400, val_fraction=0.1,
                              workers=1, recipe="none", doc_separator="<|endoftext|>"), show_progress=False)
    text = caplog.text
    assert "--doc-separator '<|endoftext|>' was not found" in text
    assert "cut a file into documents with --doc-separator" not in text
    assert "milton_all.txt@0" not in text and "the one document of" in text and "milton_all.txt" in text


def test_separator_found_keeps_the_old_advice_off(tmp_path, stdlib_texts, caplog):
    """A separator that does cut the file: no position split, no 'not found'."""
    src = tmp_path / "many.txt"
    src.write_text("<|endoftext|>".join(stdlib_texts[:20]), encoding="utf-8")
    with caplog.at_level("WARNING", logger="gptforge.data"):
        prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "data"), vocab_size=400, val_fraction=0.1,
                              workers=1, recipe="none", doc_separator="<|endoftext|>"), show_progress=False)
    assert "was not found" not in caplog.text


def test_empty_separator_is_refused(tmp_path, stdlib_texts):
    src = _one_file(tmp_path, stdlib_texts)
    with pytest.raises(ValueError, match="empty separator"):
        prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "data"), doc_separator=""), show_progress=False)
    assert not (tmp_path / "data").exists()


def test_one_document_advice_names_doc_separator_for_prepare(tmp_path, stdlib_texts, caplog):
    """prepare's own users keep the advice that names its --doc-separator (the quickstart passes its own)."""
    src = _one_file(tmp_path, stdlib_texts)
    with caplog.at_level("WARNING", logger="gptforge.data"):
        prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "data"), vocab_size=400, val_fraction=0.1,
                              workers=1, recipe="none"), show_progress=False)
    assert "give more documents, or cut a file into documents with --doc-separator" in caplog.text
