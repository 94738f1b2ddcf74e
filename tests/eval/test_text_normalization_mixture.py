"""`evaluate --text` on a model trained on a mixture normalizes the text with its sources' recipe
(issue 41 item 7: it said no recipe was recorded, and applied no Unicode form)."""

from __future__ import annotations

import random

from gptforge.data.prepare import PrepareConfig
from gptforge.data.prepare_sources import prepare_sources
from gptforge.eval.text_perplexity import normalize_like_prepare
from gptforge.train.sources.mixture import open_source

WORDS = "the river city garden market school teacher children morning winter summer bridge station".split()


def _corpus(root, name: str):
    rng = random.Random(name)
    d = root / name
    d.mkdir(parents=True)
    for k in range(20):
        (d / f"{k:03d}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(60)) + ".", encoding="utf-8")
    return d


def _run_doc(tmp_path, recipes):
    en, zh = _corpus(tmp_path, "en"), _corpus(tmp_path, "zh")
    out = tmp_path / "mix"
    prepare_sources(PrepareConfig(inputs=[], out=str(out), recipe="none", vocab_size=300, val_fraction=0.2,
                                  workers=1), {"en": [str(en)], "zh": [str(zh)]}, recipes=recipes,
                    show_progress=False)
    source = open_source(str(out), 32, 4, lambda _m: None)
    try:
        return {"data": source.provenance()}, out  # config.yaml's `data` of a run trained on it
    finally:
        source.close()


def test_a_mixture_run_normalizes_with_its_sources_recipe(tmp_path):
    doc, out = _run_doc(tmp_path, None)
    text, what = normalize_like_prepare("cafe\u0301 \ufb01\r\n", doc)
    assert text == "caf\u00e9 \ufb01\n"  # NFC composes, and leaves the ligature
    assert "no prepare recipe recorded" not in what
    assert "Unicode NFC (the recipe's, from" in what and str(out / "en" / "meta.json") in what


def test_sources_with_different_forms_are_said(tmp_path):
    nfkc = tmp_path / "nfkc.yaml"
    nfkc.write_text("normalization: NFKC\nsteps: []\n", encoding="utf-8")
    doc, out = _run_doc(tmp_path, {"zh": str(nfkc)})
    text, what = normalize_like_prepare("cafe\u0301 \ufb01", doc)
    assert text == "caf\u00e9 \ufb01"  # the first source's (en) NFC
    assert "the sources' recipes differ" in what and "NFKC" in what and str(out / "zh" / "meta.json") in what


def test_a_run_without_recorded_data_says_so():
    text, what = normalize_like_prepare("a\r\nb", {"data": {"path": "/nonexistent/folder"}})
    assert text == "a\nb" and "no prepare recipe recorded" in what
