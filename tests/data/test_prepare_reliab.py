"""prepare under hostile conditions: reruns with other options, leftovers, stray workers (issue 15)."""

from __future__ import annotations

import shutil

import pytest

from gptforge.data.curate import work_dir_for
from gptforge.data.prepare import PrepareConfig, prepare
from gptforge.data.shards import load_meta, load_tokenizer


@pytest.fixture(scope="module")
def txt_corpus(tmp_path_factory, stdlib_texts):
    root = tmp_path_factory.mktemp("corpus")
    for i, text in enumerate(stdlib_texts[:12]):
        (root / f"doc{i:02d}.txt").write_text(text, encoding="utf-8")
    return root


def _cfg(corpus, out, **kw):
    base = dict(inputs=[str(corpus)], out=str(out), vocab_size=400, val_fraction=0.1, workers=1, recipe="none")
    base.update(kw)
    return PrepareConfig(**base)


def test_rerun_with_another_vocab_size_does_not_reuse_the_work_folder(txt_corpus, tmp_path, caplog):
    out = tmp_path / "data"
    prepare(_cfg(txt_corpus, out, vocab_size=400, keep_work=True), show_progress=False)
    assert work_dir_for(out).is_dir()
    shutil.rmtree(out)  # as if killed after the tokenizer was cached in the work folder
    with caplog.at_level("WARNING", logger="gptforge.data"):
        prepare(_cfg(txt_corpus, out, vocab_size=300), show_progress=False)
    meta = load_meta(out)
    assert meta["prepare_config"]["vocab_size"] == 300
    assert load_tokenizer(out).vocab_size == meta["vocab_size"] <= 300
    assert "vocab_size" in caplog.text and "starting over" in caplog.text


@pytest.mark.parametrize("change", [{"min_frequency": 5}, {"seed": 7}, {"val_fraction": 0.3},
                                    {"tokenizer_train_bytes": 20_000}])
def test_every_output_option_is_in_the_fingerprint(txt_corpus, tmp_path, change):
    from gptforge.data.prepare import work_fingerprint

    a = work_fingerprint(_cfg(txt_corpus, tmp_path / "o"), [txt_corpus], {})
    b = work_fingerprint(_cfg(txt_corpus, tmp_path / "o", **change), [txt_corpus], {})
    assert a != b
    # ... but not workers, which never changes the output
    c = work_fingerprint(_cfg(txt_corpus, tmp_path / "o", workers=3), [txt_corpus], {})
    assert a == c
