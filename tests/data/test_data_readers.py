"""Readers: every format, compressed or not; bad input skipped, named and counted."""

from __future__ import annotations

import gzip
import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from gptforge.data.readers import ReadStats, expand_inputs, read_documents, sniff_binary

DOCS = ["first document\nwith two lines", "second: 你好 🎉", "third <|endoftext|> literal"]


def _write(path, data: bytes, comp: str = "") -> None:
    if comp == ".gz":
        data = gzip.compress(data)
    elif comp == ".zst":
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)


def _jsonl(docs, field="text") -> bytes:
    return "".join(json.dumps({field: d, "n": i}, ensure_ascii=False) + "\n" for i, d in enumerate(docs)).encode()


def _read(inputs, **kw):
    stats = ReadStats()
    docs = list(read_documents(inputs, stats, **kw))
    return docs, stats


@pytest.mark.parametrize("comp", ["", ".gz", ".zst"])
def test_jsonl_plain_and_compressed(tmp_path, comp):
    p = tmp_path / f"c.jsonl{comp}"
    _write(p, _jsonl(DOCS), comp)
    docs, stats = _read([p])
    assert [d.text for d in docs] == DOCS
    assert [d.id for d in docs] == [f"{p}:{i}" for i in (1, 2, 3)]
    assert (docs[1].metadata, docs[1].source) == ({"n": 1}, str(p))
    assert stats.documents == 3 and stats.files_read == 1 and not stats.files_skipped


@pytest.mark.parametrize("comp", ["", ".gz", ".zst"])
def test_txt_md_one_document_per_file(tmp_path, comp):
    _write(tmp_path / f"a.txt{comp}", DOCS[1].encode(), comp)
    _write(tmp_path / f"b.md{comp}", DOCS[0].encode(), comp)
    docs, stats = _read([tmp_path])
    assert [d.text for d in docs] == [DOCS[1], DOCS[0]]  # sorted by name: a.txt, b.md
    assert docs[0].id == str(tmp_path / f"a.txt{comp}")


@pytest.mark.parametrize("comp", ["", ".gz", ".zst"])
def test_parquet_by_row_groups(tmp_path, comp):
    table = pa.table({"body": DOCS * 3, "x": list(range(9))})
    plain = tmp_path / "plain.parquet"
    pq.write_table(table, plain, row_group_size=2)  # 5 row groups
    p = tmp_path / f"t.parquet{comp}"
    _write(p, plain.read_bytes(), comp)
    if comp:
        plain.unlink()
    docs, stats = _read([p], text_field="body")
    assert [d.text for d in docs] == DOCS * 3
    assert docs[4].id == f"{p}#4"


def test_json_array_and_pretty_object(tmp_path):
    arr = tmp_path / "a.json"
    arr.write_text(json.dumps([{"text": d} for d in DOCS], indent=2, ensure_ascii=False), encoding="utf-8")
    obj = tmp_path / "b.json"
    obj.write_text(json.dumps({"text": "one pretty object", "k": 1}, indent=2), encoding="utf-8")
    docs, stats = _read([arr, obj])
    assert [d.text for d in docs] == DOCS + ["one pretty object"]
    assert docs[1].id == f"{arr}#1"
    assert not stats.records_skipped


def test_text_field_option_and_long_line(tmp_path):
    long_text = "word " * 400_000  # a 2 MB JSON line: no fixed line-size limit
    p = tmp_path / "s.jsonl"
    p.write_text(json.dumps({"story": long_text}) + "\n" + json.dumps({"story": "short"}) + "\n")
    docs, _ = _read([p], text_field="story")
    assert [d.text for d in docs] == [long_text, "short"]


def test_glob_and_folder_walk(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.txt").write_text("x")
    (tmp_path / "y.txt").write_text("y")
    (tmp_path / "z.bin").write_bytes(b"not picked up by a folder walk")
    (tmp_path / ".hidden.txt").write_text("hidden")
    files = expand_inputs([tmp_path])
    assert files == [tmp_path / "sub" / "x.txt", tmp_path / "y.txt"]
    assert expand_inputs([str(tmp_path / "**" / "*.txt")]) == [tmp_path / "sub" / "x.txt", tmp_path / "y.txt"]
    # An explicitly named file is read whatever its extension.
    docs, _ = _read([tmp_path / "z.bin"])
    assert docs[0].text == "not picked up by a folder walk"


def test_missing_path_is_an_error_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        _read([tmp_path / "nope.jsonl"])
    with pytest.raises(FileNotFoundError, match=r"\*\.zzz"):
        _read([str(tmp_path / "*.zzz")])


def test_binary_files_skipped_and_counted(tmp_path, caplog):
    (tmp_path / "good.txt").write_text("good text")
    (tmp_path / "nul.txt").write_bytes(b"looks like text\x00\x01\x02 but has NUL bytes")
    (tmp_path / "noise.txt").write_bytes(bytes(range(128, 256)) * 50)  # invalid UTF-8 throughout
    with caplog.at_level(logging.WARNING, logger="gptforge.data"):
        docs, stats = _read([tmp_path])
    assert [d.text for d in docs] == ["good text"]
    assert stats.files_skipped == {"binary": 2}
    assert "nul.txt" in caplog.text and "noise.txt" in caplog.text and "binary" in caplog.text


def test_undecodable_bytes_replaced_and_counted(tmp_path):
    p = tmp_path / "a.txt"
    p.write_bytes(b"caf\xe9 au lait, na\xefve " + "é ok".encode() + b" " * 200)
    docs, stats = _read([p])
    assert docs[0].text.startswith("caf\ufffd au lait, na\ufffdve é ok")
    assert stats.undecodable_sequences == 2 and stats.documents_with_undecodable == 1


def test_sniff_does_not_flag_a_multibyte_char_cut_at_the_window():
    assert sniff_binary(("中" * 10).encode()[:-1]) is None
    assert sniff_binary(b"a\x00b") == "contains NUL bytes"


def test_bad_jsonl_lines_named_with_file_and_line(tmp_path, caplog):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"text": "ok 1"}\n{not json\n{"other": "no text field"}\n{"text": 5}\n[1, 2]\n\n{"text": "ok 2"}\n')
    with caplog.at_level(logging.WARNING, logger="gptforge.data"):
        docs, stats = _read([p])
    assert [d.text for d in docs] == ["ok 1", "ok 2"]
    assert [d.id for d in docs] == [f"{p}:1", f"{p}:7"]
    assert stats.records_skipped == {"bad_json": 1, "missing_field": 1, "field_not_string": 1, "not_an_object": 1}
    assert f"{p}:2" in caplog.text and "not valid JSON" in caplog.text
    assert f"{p}:3" in caplog.text and "'text'" in caplog.text and "--text-field" in caplog.text


@pytest.mark.parametrize("comp", [".gz", ".zst"])
def test_truncated_archive_keeps_complete_documents(tmp_path, caplog, comp):
    lines = [f"document number {i} " + "filler " * 200 for i in range(400)]
    data = _jsonl(lines)
    full = gzip.compress(data) if comp == ".gz" else zstandard.ZstdCompressor().compress(data)
    p = tmp_path / f"cut.jsonl{comp}"
    p.write_bytes(full[: len(full) // 2])
    good = tmp_path / "good.txt"
    good.write_text("after the damaged file")
    with caplog.at_level(logging.WARNING, logger="gptforge.data"):
        docs, stats = _read([p, good])
    texts = [d.text for d in docs]
    assert texts[-1] == "after the damaged file"  # the run goes on past the damaged file
    kept = texts[:-1]
    assert 0 < len(kept) < 400
    assert kept == lines[: len(kept)]  # complete documents only, in order, none partial
    assert stats.files_truncated == 1
    assert str(p) in caplog.text and "truncated" in caplog.text


def test_truncated_txt_gz_drops_the_partial_document(tmp_path):
    full = gzip.compress(("text " * 50_000).encode())
    p = tmp_path / "a.txt.gz"
    p.write_bytes(full[:-20])
    docs, stats = _read([p])
    assert docs == [] and stats.files_truncated == 1


def test_bad_files_among_good_ones(tmp_path, caplog):
    (tmp_path / "1.jsonl").write_text('{"text": "one"}\n')
    (tmp_path / "2.parquet").write_bytes(b"PAR1 this is no parquet file at all PAR1")
    (tmp_path / "3.jsonl.gz").write_bytes(b"definitely not gzip")
    (tmp_path / "4.parquet").write_bytes(b"")
    pq.write_table(pa.table({"content": ["x"]}), tmp_path / "5.parquet")  # lacks the text column
    (tmp_path / "6.txt").write_text("six")
    with caplog.at_level(logging.WARNING, logger="gptforge.data"):
        docs, stats = _read([tmp_path])
    assert [d.text for d in docs] == ["one", "six"]
    assert stats.files_skipped == {"bad_parquet": 2, "missing_field": 1}
    assert stats.files_truncated == 1  # the non-gzip .gz: damaged archive, nothing kept
    for name in ("2.parquet", "3.jsonl.gz", "4.parquet", "5.parquet"):
        assert name in caplog.text
    assert "'text'" in caplog.text and "content" in caplog.text
