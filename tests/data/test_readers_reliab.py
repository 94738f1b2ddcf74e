"""Readers under bad input: strict CSV, binary and UTF-16/32 detection (issue 15 items 4 and 5)."""

from __future__ import annotations

import pytest

from gptforge.data.readers import ReadStats, read_documents


def _csv(tmp_path, lines):
    p = tmp_path / "rows.csv"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def _read(path, **kw):
    stats = ReadStats(quiet=True, **kw)
    docs = list(read_documents([str(path)], stats))
    return docs, stats


def test_unclosed_quote_skips_one_row_and_keeps_the_rest(tmp_path):
    lines = ["id,text"] + [f'{i},"row {i}, a cell with a comma"' for i in range(10)]
    lines[4] = '3,"row 3 has an unclosed quote, and goes on'
    p = _csv(tmp_path, lines)
    docs, stats = _read(p)
    assert [d.text for d in docs] == [f"row {i}, a cell with a comma" for i in range(10) if i != 3]
    assert sum(stats.records_skipped.values()) == 1
    assert any(f"{p}:5" in w for w in stats.warnings)


def test_rows_with_extra_cells_are_counted_with_their_line(tmp_path):
    lines = ["id,text", '0,"fine"', "1,unquoted, comma splits the text", '2,"fine too"']
    p = _csv(tmp_path, lines)
    docs, stats = _read(p)
    assert [d.text for d in docs] == ["fine", "fine too"]
    assert sum(stats.records_skipped.values()) == 1
    assert any(f"{p}:3" in w and "3 cells" in w for w in stats.warnings)


def test_multiline_cells_still_read(tmp_path):
    lines = ["id,text", '0,"first line', 'second line"', '1,"x"']
    docs, stats = _read(_csv(tmp_path, lines))
    assert [d.text for d in docs] == ["first line\nsecond line", "x"]
    assert not stats.records_skipped


def test_strict_stops_at_the_malformed_row(tmp_path):
    from gptforge.data.readers import BadInputError

    lines = ["id,text", '0,"ok"', '1,"bad"x']
    p = _csv(tmp_path, lines)
    with pytest.raises(BadInputError, match=f"{p}:3"):
        _read(p, strict=True)


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
