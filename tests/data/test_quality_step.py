"""The quality step of prepare (`--quality-reference/-model/-keep/-threshold`, gptforge.data.quality):
the classifier keeps the documents like the reference, the cut is exact, reruns give the same
bytes, a rerun changing only the cut reuses the scores, a mixture cuts per source, bad input is
one line with nothing written.

The corpus: 40 generated stories (the wanted register, like the reference) and 40 docstrings of the
standard library (fluent text of another register). Local/Ray byte identity is the `quality` case of
tests/data/test_prepare_golden.py, which test_prepare_ray.py runs on a two-node cluster.
"""

from __future__ import annotations

import inspect
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn", reason="the quality step needs scikit-learn")

from gptforge.data.prepare import PrepareConfig, prepare  # noqa: E402
from gptforge.data.quality import MIN_REFERENCE_DOCUMENTS, QualityModel, keep_cut  # noqa: E402
from gptforge.errors import InputError  # noqa: E402

WORDS = ("the river city garden market school teacher children morning winter summer bridge station village farmer "
         "harvest letter window kitchen library museum painter music story island walked found opened carried "
         "watched built wrote visited remembered explained noticed quiet bright small ancient narrow busy").split()


def _story(rng: random.Random) -> str:
    return "\n\n".join(" ".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 15))).capitalize() + "."
                                for _ in range(4)) for _ in range(2))


def _docstrings(n: int) -> list[str]:
    import argparse
    import collections
    import decimal
    import json as json_module
    import logging
    import pathlib
    import subprocess as sp
    import unittest

    found: list[str] = []
    for m in (json_module, collections, argparse, unittest, logging, sp, pathlib, decimal):
        for _, obj in inspect.getmembers(m):
            d = inspect.getdoc(obj)
            if d and len(d) > 300 and d not in found:
                found.append(d)
    assert len(found) >= n
    return found[:n]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("quality")
    rng = random.Random(0)
    (root / "corpus").mkdir()
    (root / "reference").mkdir()
    for i in range(40):
        (root / "corpus" / f"story_{i:03d}.txt").write_text(_story(rng), encoding="utf-8")
    for i, d in enumerate(_docstrings(40)):
        (root / "corpus" / f"doc_{i:03d}.txt").write_text(d, encoding="utf-8")
    for i in range(30):
        (root / "reference" / f"ref_{i:03d}.txt").write_text(_story(rng), encoding="utf-8")
    return root


def _run(corpus: Path, out: str, **options):
    cfg = PrepareConfig(inputs=[str(corpus / "corpus")], out=str(corpus / out), vocab_size=300, workers=1,
                        **options)
    return prepare(cfg, show_progress=False)


def _scores(out: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(out / "quality" / "scores.parquet").to_pylist()


def test_keeps_the_documents_like_the_reference(corpus):
    result = _run(corpus, "keep", quality_reference=str(corpus / "reference"), quality_keep=0.5)
    q = result.report["quality"]
    rows = _scores(corpus / "keep")
    # dedup may drop a near-duplicate docstring first: the step scores what every other step kept.
    n = len(rows)
    assert q["scored"] == n >= 78
    assert q["kept"] == math.ceil(0.5 * n) == sum(r["kept"] for r in rows)
    kept_ids = [r["id"] for r in rows if r["kept"]]
    # The classifier separates the registers: the 40 stories are the best scored.
    assert sum("story_" in i for i in kept_ids) == 40, kept_ids
    assert min(r["score"] for r in rows if r["kept"]) >= q["threshold"] > max(r["score"] for r in rows if not r["kept"])
    assert q["model"]["held_out_auc"] > 0.95
    assert q["model"]["positive_documents"] == 30 and q["model"]["negative_documents"] == 30
    assert result.meta["splits"]["train"]["documents"] + result.meta["splits"]["val"]["documents"] == q["kept"]
    # The report: a step in the chain that adds up, the section and its examples.
    step = next(s for s in result.report["steps"] if s["name"] == "quality")
    assert step["documents_in"] == n and step["documents_out"] == q["kept"]
    assert step["dropped"] == {"low_quality_score": n - q["kept"]}
    assert result.report["check"]["adds_up"]
    html = (corpus / "keep" / "report.html").read_text(encoding="utf-8")
    assert "Quality classifier" in html and "Highest scored" in html
    assert all(ex["kept"] for ex in q["highest"]) and not any(ex["kept"] for ex in q["lowest"])
    # The training documents are recorded by hash.
    record = json.loads((corpus / "keep" / "quality" / "quality.json").read_text())
    assert len(record["positive_sha256"]) == 30 and len(record["negative_sha256"]) == 30


def test_rerun_and_other_worker_count_give_the_same_bytes(corpus):
    _run(corpus, "keep-a", quality_reference=str(corpus / "reference"), quality_keep=0.3)
    cfg = PrepareConfig(inputs=[str(corpus / "corpus")], out=str(corpus / "keep-b"), vocab_size=300, workers=2,
                        shard_bytes=20_000, quality_reference=str(corpus / "reference"), quality_keep=0.3)
    prepare(cfg, show_progress=False)
    a, b = corpus / "keep-a", corpus / "keep-b"
    assert (a / "quality" / "model.npz").read_bytes() == (b / "quality" / "model.npz").read_bytes()
    for name in ("train_000.bin", "tokenizer.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    by_id = {r["id"]: (r["score"], r["kept"]) for r in _scores(a)}
    assert by_id == {r["id"]: (r["score"], r["kept"]) for r in _scores(b)}


def test_threshold_rerun_reuses_the_scores(corpus):
    _run(corpus, "rethr", quality_reference=str(corpus / "reference"), quality_keep=0.5)
    before = {r["id"]: r["score"] for r in _scores(corpus / "rethr")}
    result = _run(corpus, "rethr", quality_reference=str(corpus / "reference"), quality_threshold=0.55,
                  overwrite=True)
    q = result.report["quality"]
    assert q["reused_scores"] is True and q["threshold"] == 0.55 and q["threshold_given"]
    rows = _scores(corpus / "rethr")
    assert {r["id"]: r["score"] for r in rows} == before
    assert [r["kept"] for r in rows] == [r["score"] >= 0.55 for r in rows]
    assert q["kept"] == sum(s >= 0.55 for s in before.values())


def test_a_saved_model_scores_the_same(corpus):
    _run(corpus, "trained", quality_reference=str(corpus / "reference"), quality_keep=0.5)
    model = corpus / "trained" / "quality" / "model.npz"
    result = _run(corpus, "loaded", quality_model=str(model), quality_keep=0.5)
    assert result.report["quality"]["model_sha256"] == QualityModel.load(model).sha256()
    assert {r["id"]: r["score"] for r in _scores(corpus / "loaded")} == \
        {r["id"]: r["score"] for r in _scores(corpus / "trained")}


def test_mixture_cuts_per_source(corpus, tmp_path):
    from gptforge.data.prepare_sources import prepare_sources

    cfg = PrepareConfig(inputs=[], out=str(tmp_path / "mix"), vocab_size=300, workers=1,
                        quality_reference=str(corpus / "reference"), quality_keep=0.25)
    stories = sorted((corpus / "corpus").glob("story_*"))
    docs = sorted((corpus / "corpus").glob("doc_*"))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for p in stories[:20] + docs[:20]:
        (tmp_path / "a" / p.name).write_bytes(p.read_bytes())
    for p in stories[20:32] + docs[20:40]:
        (tmp_path / "b" / p.name).write_bytes(p.read_bytes())
    result = prepare_sources(cfg, {"a": [str(tmp_path / "a")], "b": [str(tmp_path / "b")]}, show_progress=False)
    for name in ("a", "b"):
        q = result.sources[name].report["quality"]
        assert q["scored"] >= 30 and q["kept"] == math.ceil(0.25 * q["scored"]), (name, q["scored"], q["kept"])
        assert (tmp_path / "mix" / name / "quality" / "scores.parquet").is_file()


def test_keep_cut_is_exact_with_ties():
    scores = [np.array([0.5, np.nan, 0.5, 0.9]), np.array([0.5, 0.1])]
    cut, kept = keep_cut(scores, 0.6, None)  # 5 scored: keep 3, the ties by position
    assert cut == 0.5
    assert kept[0].tolist() == [True, False, True, True] and kept[1].tolist() == [False, False]
    cut, kept = keep_cut(scores, None, 0.5)
    assert kept[0].tolist() == [True, False, True, True] and kept[1].tolist() == [True, False]


def test_recipe_yaml_and_show_recipe(corpus, tmp_path):
    from gptforge.data.pipeline import build_recipe, show_recipe

    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"steps:\n  - clean: {{}}\n  - dedup: {{}}\n  - quality: {{reference: {corpus / 'reference'}, "
                      f"keep: 0.5}}\n", encoding="utf-8")
    assert build_recipe({"steps": [{"dedup": {}}, {"quality": {"model": "m.npz", "threshold": 0.7}}]}).quality.threshold == 0.7
    shown = show_recipe("default", None, {"reference": "good/", "keep": 0.3, "model": None, "threshold": None})
    assert "quality:" in shown and "keep: 0.3" in shown and "reference: good/" in shown
    result = _run(corpus, "yaml", recipe=str(recipe))
    assert result.report["quality"]["kept"] == math.ceil(0.5 * result.report["quality"]["scored"])
    with pytest.raises(ValueError, match="must be the last step"):
        build_recipe({"steps": [{"quality": {"model": "m.npz"}}, {"dedup": {}}]})


@pytest.mark.parametrize("options, message", [
    ({"quality_keep": 0.0}, "--quality-keep must be in (0, 1]"),
    ({"quality_keep": 1.5}, "--quality-keep must be in (0, 1]"),
    ({"quality_threshold": 2.0}, "--quality-threshold must be in [0, 1]"),
])
def test_bad_values_are_refused_before_anything_is_written(corpus, options, message):
    with pytest.raises(ValueError) as e:
        _run(corpus, "bad", quality_reference=str(corpus / "reference"), **options)
    assert message in str(e.value)
    assert not (corpus / "bad").exists() and not (corpus / ".bad.work").exists()


def test_too_few_reference_documents_say_how_many(corpus, tmp_path):
    few = tmp_path / "few"
    few.mkdir()
    for i in range(5):
        (few / f"{i}.txt").write_text(f"A short reference text number {i}.", encoding="utf-8")
    with pytest.raises(InputError, match=f"5 non-empty documents, at least {MIN_REFERENCE_DOCUMENTS} are needed"):
        _run(corpus, "few", quality_reference=str(few))
    assert not (corpus / "few").exists() and not (corpus / ".few.work").exists()


def test_model_file_of_another_kind(corpus, tmp_path, monkeypatch):
    import gptforge.data.prepare as prepare_module

    def never(*a, **k):
        raise AssertionError("curation ran before the model file was checked")

    monkeypatch.setattr(prepare_module, "run_curate", never)
    other = tmp_path / "other.npz"
    np.savez(other, weights=np.zeros(3))
    text = tmp_path / "model.txt"
    text.write_text("not a model", encoding="utf-8")
    for path in (other, text):
        with pytest.raises(InputError, match="not a gptforge quality model"):
            _run(corpus, "other", quality_model=str(path))
        assert not (corpus / "other").exists()


def test_cli_bad_keep_is_one_line(corpus, tmp_path):
    r = subprocess.run([sys.executable, "-m", "gptforge.cli", "prepare", str(corpus / "corpus"), "--out",
                        str(tmp_path / "o"), "--quality-reference", str(corpus / "reference"), "--quality-keep", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("gptforge prepare: error: --quality-keep must be in (0, 1]"), r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "o").exists()


def test_a_rerun_with_other_quality_options_names_them(corpus):
    _run(corpus, "named", quality_reference=str(corpus / "reference"), quality_keep=0.3)
    with pytest.raises(FileExistsError) as e:
        _run(corpus, "named", quality_reference=str(corpus / "reference"), quality_keep=0.5)
    assert "--quality-keep 0.3 (this call: 0.5)" in str(e.value)
    with pytest.raises(FileExistsError) as e:
        _run(corpus, "named")  # no quality step this time
    assert "--quality-reference" in str(e.value) and "(this call: null)" in str(e.value)
