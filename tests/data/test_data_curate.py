"""Curation inside prepare: recipes, sharded execution, resume, report, clean/langid/boilerplate steps."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gptforge.cli import main as _cli


def prepare_main(argv):
    """`gptforge prepare ARGV` through the CLI (its one error wrapper)."""
    return _cli(["prepare", *argv])


from gptforge.data.boilerplate import BoilerplateLines, count_lines, line_key
from gptforge.data.langid import LanguageID
from gptforge.data.normalize import Clean
from gptforge.data.phases import curate as prepare_mod
from gptforge.data.prepare import EmptyCorpusError, PrepareConfig, prepare
from gptforge.data.readers import Document
from gptforge.data.shards import load_meta


@pytest.fixture(scope="module")
def dup_corpus(tmp_path_factory, stdlib_texts):
    """30 real documents, 3 exact copies and 3 near copies (one word changed) under other names."""
    root = tmp_path_factory.mktemp("dups")
    for i, t in enumerate(stdlib_texts[:30]):
        (root / f"a{i:02d}.txt").write_text(t)
    for i in range(3):
        (root / f"b_copy{i}.txt").write_text(stdlib_texts[i])
        words = stdlib_texts[10 + i].split(" ")
        words[len(words) // 2] = "CHANGED"
        (root / f"b_near{i}.txt").write_text(" ".join(words))
    return root


def _run(root, out, tok=None, **kw):
    cfg = dict(inputs=[str(root)], out=str(out), vocab_size=300, val_fraction=0.1, workers=1, shard_bytes=30_000)
    cfg.update(kw)
    if tok is not None:
        cfg["tokenizer"] = str(tok)
    return prepare(PrepareConfig(**cfg), show_progress=False)


def _bins(out):
    meta = load_meta(out)
    return {n: (out / n).read_bytes() for s in meta["splits"].values() for n in s["files"]}


def test_dedup_report_and_worker_invariance(dup_corpus, tmp_path):
    a = _run(dup_corpus, tmp_path / "a", workers=1)
    _run(dup_corpus, tmp_path / "b", workers=2)
    rep = a.report
    assert rep["inputs"]["shards"] > 3  # several shards, duplicates spread across them
    dedup = next(s for s in rep["steps"] if s["name"] == "dedup")
    assert dedup["dropped"] == {"exact_duplicate": 3, "near_duplicate": 3}
    assert rep["dedup"]["cluster_sizes"] == {"2": 6}
    assert any("b_copy" in e for e in dedup["examples"]["exact_duplicate"])
    # Independent counts add up: read = dropped (each step, as counted in the workers) + written
    # (recounted from the .bin files' EOS ids).
    c = rep["check"]
    assert c["documents_read"] == 36 and c["documents_written"] == 30 and c["documents_dropped"] == 6
    assert c["adds_up"] and c["meta_matches_files"] and c["steps_chain"]
    assert sum(v["documents"] for v in rep["output_recounted"].values()) == 30
    assert sum(rep["histograms"]["tokens_per_document"]) == 30
    on_disk = json.loads((tmp_path / "a" / "report.json").read_text())
    assert on_disk["check"] == c
    html = (tmp_path / "a" / "report.html").read_text()
    from plotly.offline import get_plotlyjs

    assert html.count(get_plotlyjs()) == 1 and "exact_duplicate" in html  # plotly.js inline, once
    assert html.count("Plotly.newPlot(") >= 3 and "<script src" not in html
    # The same bytes whatever the worker count.
    assert _bins(tmp_path / "a") == _bins(tmp_path / "b")
    assert (tmp_path / "a" / "meta.json").read_bytes() == (tmp_path / "b" / "meta.json").read_bytes()
    assert not (tmp_path / ".a.work").exists()


def test_resume_after_interrupt_skips_finished_shards(dup_corpus, tmp_path, small_tokenizer, monkeypatch):
    tok = tmp_path / "tok.json"
    small_tokenizer.save(tok)
    _run(dup_corpus, tmp_path / "ref", tok)
    calls = []
    real = prepare_mod.curate_task

    def crashing(task):
        calls.append(task["index"])
        if len(calls) == 3:
            raise KeyboardInterrupt  # Ctrl-C in the middle of the third shard
        return real(task)

    monkeypatch.setattr(prepare_mod, "curate_task", crashing)
    with pytest.raises(KeyboardInterrupt):
        _run(dup_corpus, tmp_path / "o", tok)
    assert not (tmp_path / "o").exists()
    work = tmp_path / ".o.work"
    assert sorted(p.name for p in (work / "curate").glob("*.json")) == ["00000.json", "00001.json"]
    calls.clear()
    monkeypatch.setattr(prepare_mod, "curate_task", lambda t: (calls.append(t["index"]), real(t))[1])
    r = _run(dup_corpus, tmp_path / "o", tok)
    assert 0 not in calls and 1 not in calls and 2 in calls  # finished shards were not redone
    assert r.report["resumed"] and r.report["check"]["adds_up"]
    assert _bins(tmp_path / "o") == _bins(tmp_path / "ref")
    # A changed option invalidates the work folder instead of mixing results.
    _run(dup_corpus, tmp_path / "p", tok, keep_work=True)
    r2 = _run(dup_corpus, tmp_path / "p2", tok, recipe="none")
    assert r2.report["check"]["documents_written"] == 36


def test_empty_result_names_the_step(tmp_path, small_tokenizer):
    (tmp_path / "in").mkdir()
    for i in range(3):
        (tmp_path / "in" / f"{i}.txt").write_text(f"short text number {i}")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("steps:\n  - clean: {}\n  - gopher_quality: {}\n  - dedup: {}\n")
    tok = tmp_path / "tok.json"
    small_tokenizer.save(tok)
    with pytest.raises(EmptyCorpusError, match="'gopher_quality' removed every remaining document.*too_few_words"):
        _run(tmp_path / "in", tmp_path / "o", tok, recipe=str(recipe))


def test_clean_step_both_sides():
    c = Clean(whitespace=True)
    assert c.clean("plain ascii text") == "plain ascii text"
    assert c.clean("naïve café, “quoted”") == "naïve café, “quoted”"  # correct text untouched
    assert c.clean("The Mona Lisa doesnâ€™t smile") == "The Mona Lisa doesn’t smile"
    assert c.counts["mojibake_fixed"] == 1
    assert c.clean("a\x00b\x1bc\u200bd\te") == "abcd\te"
    assert c.clean("x  \ny\n\n\n\n\nz") == "x\ny\n\nz"
    assert c.clean("    indented code\n        more") == "    indented code\n        more"
    assert Clean(form="NFKC").clean("ｆｕｌｌ ﬁ x²") == "full fi x2"
    assert Clean().clean("ｆｕｌｌ") == "ｆｕｌｌ"
    assert Clean()(Document("\x00\x01", "1")) == "empty_after_clean"


def test_langid_keeps_languages_above_score():
    step = LanguageID(languages=("en", "zh"), min_score=0.65)
    en = Document("The committee will publish its final report on the new railway next spring.", "1")
    zh = Document("今天天气很好，我们一起去公园散步吧。", "2")
    de = Document("Der Ausschuss wird seinen Abschlussbericht im nächsten Frühjahr veröffentlichen.", "3")
    kept = step(en)
    assert kept.language == "en" and kept.metadata["language_score"] >= 0.65
    assert step(zh).language == "zh"
    assert step(de) == "language_not_kept"
    assert LanguageID(languages=("en",), min_score=0.9999)(Document("ok yes", "4")) in (
        "language_score_low", "language_not_kept")
    assert step.counts == {"en kept": 1, "zh kept": 1, "de dropped": 1}


def test_boilerplate_lines_threshold(tmp_path, stdlib_texts, small_tokenizer):
    header = "Copyright (c) Example Corp. All rights reserved."
    docs = [header + "\n" + t for t in stdlib_texts[:12]] + stdlib_texts[12:20]
    keys, counts, n = count_lines(docs, 10)
    assert n == 20 and counts[np.searchsorted(keys, np.uint64(line_key(header)))] == 12
    step = BoilerplateLines(frozenset([line_key(header)]))
    out = step(Document(docs[0], "x"))
    assert header not in out.text and step.counts["lines_removed"] == 1
    assert step(Document(header, "y")) == "only_boilerplate"
    # End to end: a line in 12 of 20 documents goes at min_documents 12, stays at 13.
    (tmp_path / "in").mkdir()
    for i, d in enumerate(docs):
        (tmp_path / "in" / f"{i:02d}.txt").write_text(d)
    tok = tmp_path / "tok.json"
    small_tokenizer.save(tok)
    for min_docs, removed in ((12, 12), (13, 0)):
        recipe = tmp_path / f"r{min_docs}.yaml"
        recipe.write_text(f"steps:\n  - boilerplate: {{min_documents: {min_docs}}}\n")
        r = _run(tmp_path / "in", tmp_path / f"o{min_docs}", tok, recipe=str(recipe))
        bp = next(s for s in r.report["steps"] if s["name"] == "boilerplate")
        assert bp["counts"].get("lines_removed", 0) == removed


def test_cli_show_recipe_and_languages(tmp_path, capsys, small_tokenizer):
    assert prepare_main(["--show-recipe", "web"]) == 0
    out = capsys.readouterr().out
    assert "gopher_repetition" in out and "boilerplate" in out
    assert prepare_main(["--show-recipe", "wbe"]) == 1
    assert "did you mean 'web'" in capsys.readouterr().err
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "en.txt").write_text("The weather is lovely today and we are going for a long walk in the park.")
    (tmp_path / "in" / "fr.txt").write_text("Il fait très beau aujourd'hui et nous allons faire une longue promenade.")
    (tmp_path / "in" / "zh.txt").write_text("今天天气很好，我们一起去公园散步吧。")
    tok = tmp_path / "tok.json"
    small_tokenizer.save(tok)
    rc = prepare_main([str(tmp_path / "in"), "--out", str(tmp_path / "o"), "--tokenizer", str(tok),
                       "--languages", "en,zh", "--no-progress", "--workers", "1", "--val-fraction", "0"])
    assert rc == 0
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    lid = next(s for s in rep["steps"] if s["name"] == "langid")
    assert lid["dropped"] == {"language_not_kept": 1} and load_meta(tmp_path / "o")["splits"]["train"]["documents"] == 2
    # per-language counts add up with the drops: kept ones are the step's documents out
    assert sum(v for k, v in lid["counts"].items() if k.endswith(" dropped")) == 1
    assert sum(v for k, v in lid["counts"].items() if k.endswith(" kept")) == lid["documents_out"] == 2
    assert "kept: 1" in (tmp_path / "o" / "report.html").read_text()


def test_auto_shard_size_depends_on_corpus_not_workers(tmp_path, dup_corpus):
    from gptforge.data.phases.curate import (
        AUTO_SHARDS,
        DEFAULT_SHARD_BYTES,
        MIN_AUTO_SHARD_BYTES,
        auto_shard_bytes,
    )

    files = sorted(dup_corpus.iterdir())
    assert auto_shard_bytes(files) == MIN_AUTO_SHARD_BYTES  # a small corpus: 1 MiB shards
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:  # sparse: size without writing the bytes
        f.truncate(AUTO_SHARDS * (8 << 20))
    assert auto_shard_bytes([big]) == 8 << 20
    with open(big, "wb") as f:
        f.truncate(AUTO_SHARDS * (256 << 20))
    assert auto_shard_bytes([big]) == DEFAULT_SHARD_BYTES
    r = _run(dup_corpus, tmp_path / "o", shard_bytes=0)  # the default
    assert r.report["inputs"]["shards"] == 1 and r.report["throughput"]["curate"]["shard_cpu_seconds"] > 0
