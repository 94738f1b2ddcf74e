"""Readers added for curation: csv, bz2/xz, Arrow and save_to_disk folders, tar (nested), separators, --strict."""

from __future__ import annotations

import bz2
import csv
import io
import json
import lzma
import tarfile

import pyarrow as pa
import pytest

from gptforge.data.readers import (
    BadInputError,
    ReadStats,
    expand_inputs,
    read_documents,
)


def _texts(docs):
    return [d.text for d in docs]


def test_csv_auto_text_field_and_long_cells(tmp_path):
    p = tmp_path / "a.csv"
    long = "word " * 100_000  # far past csv's default 128 KiB field limit
    with open(p, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "content"])
        w.writerow(["1", "first, with a comma\nand a newline"])
        w.writerow(["2", long])
    docs = list(read_documents([p], text_field="auto"))
    assert _texts(docs) == ["first, with a comma\nand a newline", long]
    assert docs[0].id == f"{p}#0" and docs[0].metadata["id"] == "1"
    st = ReadStats()
    assert list(read_documents([p], st, text_field="body")) == [] and st.files_skipped == {"missing_field": 1}


@pytest.mark.parametrize("field", ["text", "story", "content", "raw_content"])
def test_auto_text_fields(tmp_path, field):
    (tmp_path / "a.jsonl").write_text(json.dumps({"meta": 1, field: "hello"}) + "\n")
    assert _texts(read_documents([tmp_path / "a.jsonl"], text_field="auto")) == ["hello"]


@pytest.mark.parametrize("comp,fn", [(".bz2", bz2.compress), (".xz", lzma.compress)])
def test_bz2_xz_and_truncation(tmp_path, comp, fn):
    import random

    rng = random.Random(0)  # varied text, so that the archive has several blocks
    data = "".join(json.dumps({"text": f"doc {i} " + " ".join(str(rng.random()) for _ in range(100))}) + "\n"
                   for i in range(1000)).encode()
    packed = fn(data)
    p = tmp_path / f"a.jsonl{comp}"
    p.write_bytes(packed)
    assert len(list(read_documents([p]))) == 1000
    cut = tmp_path / f"cut.jsonl{comp}"
    cut.write_bytes(packed[: len(packed) * 3 // 4])
    st = ReadStats()
    got = list(read_documents([cut], st))
    assert 0 < len(got) < 1000 and st.files_truncated == 1
    with pytest.raises(BadInputError, match="strict"):
        list(read_documents([cut], ReadStats(strict=True)))


def test_arrow_file_stream_and_save_to_disk_folder(tmp_path):
    table = pa.table({"text": ["a one", "b two", None], "n": [1, 2, 3]})
    with pa.OSFile(str(tmp_path / "f.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    st = ReadStats()
    assert _texts(read_documents([tmp_path / "f.arrow"], st)) == ["a one", "b two"]
    assert st.records_skipped == {"field_not_string": 1}
    # A Hugging Face save_to_disk folder: Arrow streams listed in state.json, plus JSON metadata
    # that must not be read as documents.
    ds = tmp_path / "hfds"
    ds.mkdir()
    for i, rows in enumerate([["s0", "s1"], ["s2"]]):
        t = pa.table({"story": rows})
        with pa.OSFile(str(ds / f"data-{i:05d}-of-00002.arrow"), "wb") as sink, pa.ipc.new_stream(sink, t.schema) as w:
            w.write_table(t)
    (ds / "dataset_info.json").write_text(json.dumps({"features": {"story": {"dtype": "string"}}}))
    (ds / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00002.arrow"},
                                                               {"filename": "data-00001-of-00002.arrow"}]}))
    files = expand_inputs([tmp_path / "hfds"])
    assert [f.name for f in files] == ["data-00000-of-00002.arrow", "data-00001-of-00002.arrow"]
    docs = list(read_documents([tmp_path / "hfds"], text_field="auto"))
    assert _texts(docs) == ["s0", "s1", "s2"] and docs[2].id.endswith("data-00001-of-00002.arrow#0")


def _tar_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_tar_openwebtext_layout(tmp_path):
    # openwebtext.tar.xz -> subset.xz (an xz-compressed tar, no .tar in its name) -> NNNN.txt
    inner = _tar_bytes({"0001-a.txt": b"first web page", "0002-b.txt": b"second web page"})
    outer = _tar_bytes({"openwebtext/urlsf_subset00-1_data.xz": lzma.compress(inner),
                        "openwebtext/extra.jsonl": b'{"text": "from json"}\n'})
    (tmp_path / "owt.tar.xz").write_bytes(lzma.compress(outer))
    docs = list(read_documents([tmp_path / "owt.tar.xz"]))
    assert _texts(docs) == ["first web page", "second web page", "from json"]
    assert docs[0].id.endswith("owt.tar.xz/openwebtext/urlsf_subset00-1_data.xz/0001-a.txt")
    assert docs[2].id.endswith("extra.jsonl:1")
    big = _tar_bytes({f"{i}.txt": (f"page {i} " * 400).encode() for i in range(3)})
    (tmp_path / "cut.tar").write_bytes(big[:4000])  # inside the second member
    st = ReadStats()
    got = list(read_documents([tmp_path / "cut.tar"], st))
    # Python's tarfile ends a streamed archive quietly at a cut: complete members are kept, the
    # cut one is not passed off as a document (the truncation itself is not detected; see _read_tar).
    assert _texts(got) == ["page 0 " * 400]


def test_doc_separator_streams_pieces(tmp_path):
    sep = "<|endoftext|>"
    pieces = [f"story {i} " + "y" * (i * 997) for i in range(30)]
    raw = sep.join(pieces[:10]) + sep + sep + sep.join(pieces[10:]) + sep
    (tmp_path / "t.txt").write_text(raw)
    docs = list(read_documents([tmp_path / "t.txt"], doc_separator=sep))
    assert _texts(docs) == pieces
    assert docs[10].id.endswith("t.txt@11")  # the empty piece keeps its number


def test_strict_stops_at_a_bad_line(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "ok"}\n{broken\n')
    st = ReadStats()
    assert len(list(read_documents([tmp_path / "a.jsonl"], st))) == 1 and st.records_skipped == {"bad_json": 1}
    with pytest.raises(BadInputError, match=r"a\.jsonl:2"):
        list(read_documents([tmp_path / "a.jsonl"], ReadStats(strict=True)))
