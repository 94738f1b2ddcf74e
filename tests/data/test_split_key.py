"""A document's split does not depend on where the corpus lies or how its path was typed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from gptforge.data.phases.split import split_key
from gptforge.data.prepare import PrepareConfig, prepare
from gptforge.data.shards import load_meta


def _corpus(root: Path, stdlib_texts) -> None:
    (root / "sub").mkdir(parents=True)
    for i, t in enumerate(stdlib_texts[:24]):
        (root / ("sub" if i % 2 else "") / f"doc{i:02d}.txt").write_text(t, encoding="utf-8")
    (root / "copy.txt").write_text(stdlib_texts[0], encoding="utf-8")  # a duplicate (recipe none keeps it)
    with open(root / "more.jsonl", "w", encoding="utf-8") as f:
        for t in stdlib_texts[24:34]:
            f.write(json.dumps({"text": t}) + "\n")


def _prepare(inputs: list[str], out: Path) -> dict:
    prepare(PrepareConfig(inputs=inputs, out=str(out), vocab_size=300, val_fraction=0.2, test_fraction=0.1,
                          workers=1, recipe="none"), show_progress=False)
    meta = load_meta(out)
    bins = {n: (out / n).read_bytes() for s in meta["splits"].values() for n in s["files"]}
    return {"splits": meta["splits"], "bins": bins, "moved": meta["prepare_config"]["moved_to_val_or_test"]}


def test_same_splits_from_two_folders_and_by_absolute_or_relative_path(tmp_path, stdlib_texts, monkeypatch):
    a = tmp_path / "here" / "corpus"
    _corpus(a, stdlib_texts)
    b = tmp_path / "elsewhere" / "deeper" / "copy"
    shutil.copytree(a, b)
    monkeypatch.chdir(tmp_path / "here")
    ref = _prepare([str(a)], tmp_path / "o1")
    assert ref["splits"]["val"]["documents"] >= 3 and ref["splits"]["test"]["documents"] >= 1  # a real split
    runs = {"relative": _prepare(["corpus"], tmp_path / "o2"),
            "dot-relative": _prepare(["./corpus/"], tmp_path / "o3"),
            "other folder": _prepare([str(b)], tmp_path / "o4")}
    monkeypatch.chdir(tmp_path / "elsewhere")
    # The same files named one by one, by a glob and a folder, in another order, from elsewhere.
    runs["by parts"] = _prepare(["deeper/copy/*.txt", str(b / "more.jsonl"), "deeper/copy/sub"], tmp_path / "o5")
    for name, got in runs.items():
        assert got["splits"] == ref["splits"], name
        assert got["moved"] == ref["moved"], name
    for name in ("relative", "dot-relative", "other folder"):  # same reading order: the same bytes
        assert runs[name]["bins"] == ref["bins"], name


def test_split_key_is_the_text_hash_so_copies_share_a_split():
    assert split_key("one text") == split_key("one text") != split_key("one text ")
    assert len(split_key("x")) == 32  # BLAKE2b-128, hex
