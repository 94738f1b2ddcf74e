"""A big single file tokenized in byte windows by several workers: same output (issue 15 item 16)."""

from __future__ import annotations

import json
from itertools import pairwise

import numpy as np
import pytest

from gptforge.data import prepare as prep
from gptforge.data.phases import encode as encode_phase
from gptforge.data.windows import char_to_byte_offsets, snap_to_whitespace

MIXED = "  double  spaces\n\n\nnewlines\ttabs 3.14 ünïcödé 中文字符 emoji 🎉 don't it's   \n"


def _big_text(stdlib_texts, chars: int) -> str:
    unit = MIXED.join(stdlib_texts[:30]) + MIXED
    return (unit * (chars // len(unit) + 1))[:chars]


def _prepare(tmp_path, name, src, tok, window, monkeypatch, **kw):
    monkeypatch.setattr(encode_phase, "ENCODE_WINDOW_BYTES", window)
    out = tmp_path / name
    res = prep.prepare(prep.PrepareConfig(inputs=[str(src)], out=str(out), tokenizer=str(tok), recipe="none",
                                          **kw), show_progress=False)
    files = {p.name: p.read_bytes() for p in sorted(out.glob("*.bin"))}
    return res, files


def test_snap_and_char_offsets():
    data = memoryview("ab  cd\téf 中x".encode())
    assert snap_to_whitespace(data, 1, len(data), 100) == 2  # the run "  " starts at 2
    assert snap_to_whitespace(data, 3, len(data), 100) == 6  # not inside the run: the tab after "cd"
    assert snap_to_whitespace(data, 12, len(data), 100) == len(data)  # none left: the end
    hard = snap_to_whitespace(memoryview("中中中中".encode()), 1, 12, 2)
    assert hard == 3  # a hard cut lands on a character boundary
    text = "ab 中文 🎉 z"
    offsets = char_to_byte_offsets(memoryview(text.encode()), [0, 3, 4, 6, 8, len(text)], chunk=4)
    assert offsets == [len(text[:c].encode()) for c in (0, 3, 4, 6, 8, len(text))]


@pytest.mark.parametrize("separator", [None, "<|sep|>"])
def test_windows_give_the_same_tokens_and_documents(tmp_path, monkeypatch, stdlib_texts, small_tokenizer, separator):
    """One ~0.8 MB file (one document, or ~100 with a separator) windowed into ~12 tasks on 2
    workers: the .bin files, counts and histograms equal those of the unwindowed run, and the
    report says how many tasks and processes tokenized it."""
    text = _big_text(stdlib_texts, 800_000)
    if separator:
        step = len(text) // 100
        text = separator.join(text[k:k + step] for k in range(0, len(text), step))
    src = tmp_path / "big.txt"
    src.write_text(text, encoding="utf-8")
    tok = tmp_path / "tok.json"
    small_tokenizer.save(tok)
    kw = {"doc_separator": separator, "max_shard_bytes": 100_000}
    plain, plain_files = _prepare(tmp_path, "plain", src, tok, 1 << 30, monkeypatch, workers=1, **kw)
    windowed, windowed_files = _prepare(tmp_path, "windowed", src, tok, 64 << 10, monkeypatch, workers=2, **kw)

    assert plain_files == windowed_files  # byte-identical
    assert len(plain_files) == 2 if separator is None else len(plain_files) > 3
    for data in windowed_files.values():  # files end at a document's end, though windows end inside them
        assert np.frombuffer(data, np.uint16)[-1] == small_tokenizer.eos_id
    assert plain.meta["splits"] == windowed.meta["splits"]
    docs = plain.meta["splits"]["train"]["documents"] + plain.meta["splits"]["val"]["documents"]
    assert docs == (2 if separator is None else 100)  # one document cut into train/val, or 100
    ids = np.concatenate([np.frombuffer(windowed_files[f"train_{k:03d}.bin"], np.uint16)
                          for k in range(len(plain.meta["splits"]["train"]["files"]))])
    assert int((ids == small_tokenizer.eos_id).sum()) == plain.meta["splits"]["train"]["documents"]
    for key in ("tokens_per_document", "characters_per_document"):
        assert plain.report["histograms"][key] == windowed.report["histograms"][key]
    tok_plain = plain.report["throughput"]["tokenize"]
    tok_win = windowed.report["throughput"]["tokenize"]
    assert tok_plain["tasks"] == 1 and tok_plain["windowed_shards"] == 0
    assert tok_win["tasks"] >= 10 and tok_win["windowed_shards"] == 1
    assert tok_win["processes"] == 2  # the windows ran in both worker processes
    on_disk = json.loads((tmp_path / "windowed" / "report.json").read_text())
    assert on_disk["throughput"]["tokenize"]["tasks"] == tok_win["tasks"]


def test_whole_document_tokens_equal_a_direct_encode(tmp_path, monkeypatch, stdlib_texts, small_tokenizer):
    """Windowed, the train + val tokens of one document are the tokenizer's own tokens of its text."""
    text = _big_text(stdlib_texts, 600_000)
    src = tmp_path / "one.txt"
    src.write_text(text, encoding="utf-8")
    tok = tmp_path / "tok.json"
    small_tokenizer.save(tok)
    res, files = _prepare(tmp_path, "w", src, tok, 64 << 10, monkeypatch, workers=1)
    assert res.report["throughput"]["tokenize"]["tasks"] > 5
    from gptforge.data.phases.split import split_key

    cut = res.meta["prepare_config"]["position_split"][split_key(text)][1][0]  # by the document's split key
    train = np.frombuffer(files["train_000.bin"], np.uint16)
    val = np.frombuffer(files["val_000.bin"], np.uint16)
    eos = small_tokenizer.eos_id
    np.testing.assert_array_equal(train, small_tokenizer.encode(text[:cut]) + [eos])
    np.testing.assert_array_equal(val, small_tokenizer.encode(text[cut:]) + [eos])


# ---- byte ranges of a big file cut at a document separator (curation shared by the workers) ----


def _documents(path, **kw):
    from gptforge.data.readers import ReadStats, read_file, read_file_range

    stats = ReadStats(quiet=True)
    if "ranges" in kw:
        docs = [d for a, b, k in kw["ranges"] for d in read_file_range(path, stats, kw["sep"], a, b, k)]
    else:
        docs = list(read_file(path, stats, doc_separator=kw["sep"]))
    return [(d.id, d.text) for d in docs], stats


@pytest.mark.parametrize("sep", ["<|endoftext|>", "==", "§§"])
def test_byte_ranges_read_the_same_documents_and_ids(tmp_path, monkeypatch, stdlib_texts, sep):
    """Ranges cut just after a separator give the whole reading's documents and ids, with a
    self-overlapping separator, empty pieces, invalid UTF-8 and matches straddling scan chunks."""
    from gptforge.data.readers import text as text_reader

    body = [t[: 500 + 37 * k] for k, t in enumerate(stdlib_texts[:30])]
    raw = sep.join(body + ["", "  ", "x==="]).encode() + b"\xe4" + sep.encode() + b"tail \xff end"
    src = tmp_path / "sep.txt"
    src.write_bytes(raw * 3)
    monkeypatch.setattr(text_reader, "_SCAN_BYTES", 1000)  # matches cross chunk boundaries
    ranges = text_reader.separator_ranges(src, sep, 4000)
    assert len(ranges) > 5
    assert ranges[0][0] == 0 and ranges[-1][1] == len(raw) * 3
    assert all(a[1] == b[0] for a, b in pairwise(ranges))  # contiguous
    whole, whole_stats = _documents(src, sep=sep)
    ranged, ranged_stats = _documents(src, sep=sep, ranges=ranges)
    assert ranged == whole and len(whole) > 90
    assert (ranged_stats.files_read, ranged_stats.input_bytes, ranged_stats.documents) == \
        (whole_stats.files_read, whole_stats.input_bytes, whole_stats.documents) == (1, len(raw) * 3, len(whole))


def test_a_big_separated_file_is_curated_in_byte_ranges(tmp_path, stdlib_texts, small_tokenizer):
    """--shard-bytes 64 KiB on a ~0.6 MB file with separators: ~9 range shards curated by 2
    workers (default recipe: dedup across ranges), the same output as one shard of the whole file."""
    from gptforge.data.prepare import PrepareConfig, prepare

    docs = [t[: 1000 + 50 * k] for k, t in enumerate(stdlib_texts[:40])] * 15  # duplicates for dedup
    src = tmp_path / "big.txt"
    src.write_text("<|endoftext|>".join(docs), encoding="utf-8")
    tok = tmp_path / "tok.json"
    small_tokenizer.save(tok)
    out = {}
    for name, shard_bytes, workers in (("whole", 64 << 20, 1), ("ranges", 64 << 10, 2)):
        out[name] = prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / name), tokenizer=str(tok), workers=workers,
                                          doc_separator="<|endoftext|>", shard_bytes=shard_bytes), show_progress=False)
    whole, ranges = out["whole"], out["ranges"]
    assert whole.report["inputs"]["byte_range_shards"] == 0
    assert ranges.report["inputs"]["byte_range_shards"] == ranges.report["inputs"]["shards"] > 5
    assert ranges.report["throughput"]["curate"]["processes"] == 2
    assert whole.meta["splits"] == ranges.meta["splits"]
    assert ranges.meta["splits"]["train"]["documents"] + ranges.meta["splits"]["val"]["documents"] == 40  # deduped
    for f in sorted((tmp_path / "whole").glob("*.bin")):
        assert f.read_bytes() == (tmp_path / "ranges" / f.name).read_bytes()
    assert whole.read.documents == ranges.read.documents == 600 and whole.read.files_read == ranges.read.files_read == 1
