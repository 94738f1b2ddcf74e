"""`prepare --source NAME=PATH ...`: one tokenizer over all sources, shards per source (issue 25 item 1)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gptforge.data.prepare import PrepareConfig
from gptforge.data.prepare_sources import parse_named, prepare_sources
from gptforge.data.shards import load_meta
from tests.conftest import stdlib_sample_files


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """Two folders of standard-library files: "lib" (10 files) and "more" (5 other files)."""
    import shutil

    root = tmp_path_factory.mktemp("corpora")
    files = stdlib_sample_files(15)
    for name, part in (("lib", files[:10]), ("more", files[10:15])):
        (root / name).mkdir()
        for i, f in enumerate(part):
            shutil.copyfile(f, root / name / f"{i}_{f.name}.txt")
    return root


def test_two_sources_share_one_tokenizer_and_have_their_own_splits(corpora, tmp_path):
    out = tmp_path / "mix"
    cmd = [sys.executable, "-m", "gptforge.cli", "prepare", "--source", f"lib={corpora / 'lib'}", "--source",
           f"more={corpora / 'more'}", "--source-recipe", "more=none", "--out", str(out), "--vocab-size", "320",
           "--val-fraction", "0.2", "--workers", "1", "--quiet"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert [s["name"] for s in meta["sources"]] == ["lib", "more"]
    assert [s["recipe"] for s in meta["sources"]] == ["default", "none"]
    for s in meta["sources"]:
        sub = load_meta(out / s["path"])
        assert sub["tokenizer_sha256"] == meta["tokenizer_sha256"]  # one tokenizer
        assert (out / s["path"] / "report.json").is_file()
        for split in ("train", "val"):
            assert s["splits"][split]["tokens"] == sub["splits"][split]["tokens"] > 0
            assert s["splits"][split]["documents"] == sub["splits"][split]["documents"] > 0
            assert s["splits"][split]["bytes"] == sub["splits"][split]["bytes"] > 0
    assert (out / "tokenizer.json").read_bytes() == (out / "lib" / "tokenizer.json").read_bytes()
    assert sorted(p.name for p in out.iterdir()) == ["lib", "meta.json", "more", "tokenizer.json"]
    # pretrain --data OUT sees the two sources.
    from gptforge.train.sources.mixture import MixtureSource, open_source

    source = open_source(str(out), 2, 2)
    assert isinstance(source, MixtureSource) and list(source.subs) == ["lib", "more"]
    assert source.tokenizer_file == out / "tokenizer.json"


def test_tokenizer_weights_decide_what_the_tokenizer_learns(corpora, tmp_path):
    cfg = dict(vocab_size=320, val_fraction=0.2, workers=1)
    srcs = {"lib": [str(corpora / "lib")], "more": [str(corpora / "more")]}
    a = prepare_sources(PrepareConfig(inputs=[], out=str(tmp_path / "a"), **cfg), srcs, show_progress=False)
    b = prepare_sources(PrepareConfig(inputs=[], out=str(tmp_path / "b"), **cfg), srcs,
                        tokenizer_weights={"lib": 0.0, "more": 1.0}, show_progress=False)
    assert a.meta["tokenizer_sha256"] != b.meta["tokenizer_sha256"]
    assert b.meta["tokenizer_weights"] == {"lib": 0.0, "more": 1.0}
    # The same documents per split whatever the tokenizer (the split depends on the text only).
    for s, t in zip(a.meta["sources"], b.meta["sources"], strict=True):
        assert {k: v["documents"] for k, v in s["splits"].items()} == {k: v["documents"] for k, v in t["splits"].items()}
    with pytest.raises(ValueError, match="no --source named"):
        prepare_sources(PrepareConfig(inputs=[], out=str(tmp_path / "c"), **cfg), srcs, recipes={"web": "web"})
    with pytest.raises(FileExistsError):
        prepare_sources(PrepareConfig(inputs=[], out=str(tmp_path / "a"), **cfg), srcs, show_progress=False)


def test_parse_named():
    assert parse_named(["en=a/b", "zh=c=d"], "--source") == {"en": "a/b", "zh": "c=d"}
    for bad in (["en"], ["=x"], ["a b=x"], ["en=x", "en=y"]):
        with pytest.raises(ValueError, match="--source"):
            parse_named(bad, "--source")
