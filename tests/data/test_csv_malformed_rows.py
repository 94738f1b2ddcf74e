"""CSV rows a reader cannot parse (an unclosed quote, extra cells) are skipped and counted with their
line; multiline cells still read; --strict stops at the malformed row."""

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

