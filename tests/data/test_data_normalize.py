"""Normalization: BOM, line ends, NFC; empty documents dropped and counted; width and OpenCC options."""

from __future__ import annotations

import sys
import unicodedata

import pytest

from gptforge.data.normalize import (
    OPENCC_CONFIGS,
    Clean,
    NormalizeStats,
    changed_characters,
    convert_chinese,
    fold_width,
    normalize_documents,
    normalize_text,
    opencc_converter,
)
from gptforge.data.pipeline import apply_steps, build_recipe
from gptforge.data.readers import Document


def test_bom_line_ends_and_nfc():
    decomposed = "cafe\u0301"  # e + combining acute accent
    assert unicodedata.normalize("NFC", decomposed) != decomposed
    out = normalize_text("\ufeffline one\r\nline two\rline three\n" + decomposed)
    assert out == "line one\nline two\nline three\ncaf\u00e9"
    # A BOM that is not at the start is text (zero-width no-break space) and stays.
    assert normalize_text("a\ufeffb") == "a\ufeffb"
    # NFC keeps compatibility characters that NFKC would rewrite.
    assert normalize_text("ﬁ ² Ａ") == "ﬁ ² Ａ"
    assert normalize_text("ﬁ ² Ａ", form="NFKC") == "fi 2 A"


def test_empty_documents_dropped_and_counted():
    docs = [Document(t, str(i)) for i, t in enumerate(["a\r\n", "", " \r\n\t", "\ufeff", "b"])]
    stats = NormalizeStats()
    out = list(normalize_documents(docs, stats))
    assert [d.text for d in out] == ["a\n", "b"]
    assert [d.id for d in out] == ["0", "4"]
    assert stats.documents_in == 5 and stats.documents_out == 2
    assert stats.dropped == {"empty": 3}
    assert stats.characters_out == 3


# ---- Chinese: width and script ----------------------------------------------------------------


def test_fold_width_keeps_cjk_punctuation():
    text = "型号ＧＰＴ－４ｏ，邮箱ａ＿ｂ＠ｘ．ｃｎ；共１２８页！（见「附录」）？"
    out, n = fold_width(text)
    assert out == "型号GPT-4o，邮箱a_b@x.cn；共128页！（见「附录」）？"
    assert n == 17
    assert fold_width("中文，。！？") == ("中文，。！？", 0)
    # Every code point of the three ranges folds to its ASCII twin.
    for lo, hi, ascii_lo in ((0xFF10, 0xFF19, "0"), (0xFF21, 0xFF3A, "A"), (0xFF41, 0xFF5A, "a")):
        folded, n = fold_width("".join(map(chr, range(lo, hi + 1))))
        assert n == hi - lo + 1 and folded == "".join(chr(ord(ascii_lo) + i) for i in range(n))


def test_clean_width_and_opencc_are_off_unless_asked():
    text = "漢字ＡＢＣ。"
    assert Clean(fix_mojibake=False).clean(text) == text
    c = Clean(fix_mojibake=False, width=True)
    assert c.clean(text) == "漢字ABC。" and dict(c.counts) == {"width_changed": 1, "width_characters": 3}


def test_changed_characters():
    assert changed_characters("漢字轉換", "汉字转换") == 3
    assert changed_characters("鼠标和内存", "滑鼠和記憶體") == 6
    assert changed_characters("abc内存", "abc記憶體") == 3


def _needs_opencc():
    pytest.importorskip("opencc", reason="the opencc package (pip install opencc) is not installed")


@pytest.mark.parametrize("config, text, expected", [
    ("t2s", "漢字轉換測試。", "汉字转换测试。"),
    ("s2t", "汉字转换测试。", "漢字轉換測試。"),
    ("tw2sp", "滑鼠和記憶體", "鼠标和内存"),
    ("s2twp", "鼠标和内存", "滑鼠和記憶體"),
    ("hk2s", "軟件", "软件"),
])
def test_opencc_configs(config, text, expected):
    _needs_opencc()
    conv = opencc_converter(config)
    out, n = convert_chinese("ABC\n" + text, conv)
    assert out == "ABC\n" + expected and n == changed_characters(text, expected) > 0


def test_opencc_step_in_a_recipe_counts_documents_and_characters():
    _needs_opencc()
    recipe = build_recipe({"steps": [{"clean": {"fix_mojibake": False, "opencc": "t2s", "width": True}}]})
    docs = [Document("臺灣的軟體ＡＩ。", "a"), Document("English only.", "b")]
    out = list(apply_steps(docs, recipe.steps, stats := []))
    assert [d.text for d in out] == ["台湾的软体AI。", "English only."]
    assert stats[0].counts == {"opencc_changed": 1, "opencc_characters": 4, "width_changed": 1,
                               "width_characters": 2}


def test_clean_with_opencc_pickles():
    _needs_opencc()
    import pickle

    c = pickle.loads(pickle.dumps(Clean(fix_mojibake=True, opencc="t2s", width=True)))
    assert c.clean("臺灣ＡＩ") == "台湾AI"


def test_opencc_bad_config_and_missing_package(monkeypatch):
    with pytest.raises(ValueError, match="opencc must be one of t2s, s2t"):
        Clean(fix_mojibake=False, opencc="t2x")
    assert set(OPENCC_CONFIGS) == {"t2s", "s2t", "tw2sp", "s2twp", "hk2s"}
    monkeypatch.setitem(sys.modules, "opencc", None)  # import opencc -> ImportError
    with pytest.raises(ImportError, match="pip install opencc"):
        Clean(fix_mojibake=False, opencc="t2s")


def test_prepare_counts_width_and_opencc_in_the_report(tmp_path):
    """The width and opencc options through prepare: counted per step in report.json and the summary."""
    import json

    from gptforge.data.prepare import PrepareConfig, prepare, summary_rows
    from gptforge.data.shards import load_tokenizer, open_split

    _needs_opencc()
    src = tmp_path / "src"
    src.mkdir()
    for i in range(12):
        (src / f"d{i}.txt").write_text(f"臺灣的軟體第{i}版，型號ＧＰＴ－{i}。\n", encoding="utf-8")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("steps:\n  - clean: {fix_mojibake: false, width: true, opencc: t2s}\n", encoding="utf-8")
    out = tmp_path / "out"
    res = prepare(PrepareConfig(inputs=[str(src)], out=str(out), recipe=str(recipe), vocab_size=400, workers=1,
                                val_fraction=0), show_progress=False)
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    clean = next(s for s in report["steps"] if s["name"] == "clean")
    assert clean["counts"]["width_changed"] == 12 and clean["counts"]["opencc_changed"] == 12
    assert clean["counts"]["width_characters"] == 12 * 4  # Ｇ Ｐ Ｔ －
    assert clean["counts"]["opencc_characters"] == 12 * 5  # 臺灣 軟體 號 -> 台湾 软体 号
    assert ("clean: opencc_changed", "12") in summary_rows(res)
    ids = [int(t) for mm in open_split(out, "train") for t in mm]
    text = load_tokenizer(out).decode(ids)
    assert "台湾的软体" in text and "GPT-3" in text and "臺" not in text and "Ｇ" not in text
