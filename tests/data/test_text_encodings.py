"""Text encodings: UTF-16/32 with a BOM are decoded, without one they need --encoding, and binary
files are refused rather than read as text."""

from __future__ import annotations

import pytest

from gptforge.data.readers import ReadStats, read_documents


def _read(path, **kw):
    stats = ReadStats(quiet=True, **kw)
    docs = list(read_documents([str(path)], stats))
    return docs, stats


TEXT = "A line of English text, with some ünïcödé and 中文.\nAnd a second line.\n"


@pytest.mark.parametrize("encoding,bom", [("utf-16-le", b"\xff\xfe"), ("utf-16-be", b"\xfe\xff"),
                                          ("utf-32-le", b"\xff\xfe\x00\x00"), ("utf-32-be", b"\x00\x00\xfe\xff")])
def test_utf16_and_utf32_with_a_bom_are_decoded_not_skipped(tmp_path, encoding, bom):
    p = tmp_path / "doc.txt"
    p.write_bytes(bom + TEXT.encode(encoding))
    docs, stats = _read(p)
    assert not stats.files_skipped
    assert [d.text for d in docs] == [TEXT]
    c = tmp_path / "rows.csv"
    c.write_bytes(bom + f'id,text\n0,"{TEXT}"\n'.encode(encoding))
    docs, stats = _read(c)
    assert [d.text for d in docs] == [TEXT]


def test_utf16_without_a_bom_needs_encoding(tmp_path):
    p = tmp_path / "doc.txt"
    p.write_bytes(TEXT.encode("utf-16-le"))
    docs, stats = _read(p)
    assert docs == [] and stats.files_skipped == {"binary": 1}
    assert any("--encoding" in w for w in stats.warnings)
    docs, stats = _read(p, encoding="utf-16-le")
    assert [d.text for d in docs] == [TEXT]


def test_read_text_file_refuses_binary_and_decodes_boms(tmp_path):
    import sys

    from gptforge.data.readers import read_text_file
    from gptforge.errors import InputError

    with pytest.raises(InputError, match="binary"):
        read_text_file(sys.executable)  # an ELF / Mach-O / PE file
    p = tmp_path / "u16.txt"
    p.write_bytes(b"\xff\xfe" + TEXT.encode("utf-16-le"))
    assert read_text_file(p) == TEXT
    p.write_bytes(TEXT.encode("latin-1", "replace"))
    assert read_text_file(p, encoding="latin-1") == TEXT.encode("latin-1", "replace").decode("latin-1")
    p.write_bytes(b"\xef\xbb\xbf" + TEXT.encode())
    assert read_text_file(p) == TEXT


def test_prepare_reads_a_utf16_file(tmp_path, stdlib_texts):
    from gptforge.data.prepare import PrepareConfig, prepare

    src = tmp_path / "src"
    src.mkdir()
    for i, t in enumerate(stdlib_texts[:6]):
        enc = "utf-16" if i % 2 else "utf-8"  # Python's utf-16 codec writes a BOM
        (src / f"d{i}.txt").write_bytes(t.encode(enc))
    r = prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "o"), vocab_size=300, workers=1,
                              recipe="none", val_fraction=0.2), show_progress=False)
    assert r.read.files_read == 6 and not r.read.files_skipped

