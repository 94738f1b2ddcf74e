"""Language tables: sentence ends and terminal punctuation per language, tables as data, English as before."""

from __future__ import annotations

import dataclasses
import re

import pytest

from gptforge.data import filters
from gptforge.data.languages import (
    LANGUAGES,
    canonical,
    count_sentences,
    count_stop_words,
    ends_with_terminal,
    load_language,
    terminal_line_fraction,
)
from gptforge.data.pipeline import STEPS

ZH_PARAGRAPH = "今天天气很好。我们去公园散步！你想一起来吗？公园里有很多人；孩子们在放风筝。"
JA_PARAGRAPH = "今日は晴れです。公園に行きました！一緒に来ますか？「楽しかった。」と彼は言った。"


@pytest.mark.parametrize("language, text, expected", [
    ("en", "One sentence. Two! Three? Pi is 3.14 and e.g. not here", 4),
    ("en", ZH_PARAGRAPH, 1),                    # the English rule: a space must follow
    ("zh", ZH_PARAGRAPH, 5),
    ("zh", "价格是3.5元，版本v2.0发布了。", 1),  # an ASCII full stop inside a number ends nothing
    ("zh", "真的吗?!好的……那就这样吧。Done. 好", 4),
    ("ja", JA_PARAGRAPH, 5),
    ("ko", "오늘은 날씨가 좋습니다. 공원에 갔어요! 같이 갈래요? 3.5점", 3),
])
def test_sentence_counter_per_language(language, text, expected):
    assert count_sentences(text, language) == expected


@pytest.mark.parametrize("language, line, expected", [
    ("en", "A line that ends well.", True), ("en", "A heading", False),
    ("zh", "这一行以句号结尾。", True), ("zh", "他说：“好的。”", True), ("zh", "第一条；", True),
    ("zh", "未完待续……", True), ("zh", "标题：数据准备", False), ("en", "第一条；", False),
    ("ja", "そうですね", False), ("ja", "そうですね。」", True), ("ko", "좋습니다.", True), ("ko", "제목", False),
])
def test_terminal_punctuation_per_language(language, line, expected):
    assert ends_with_terminal(line, language) is expected


def test_terminal_line_fraction():
    lines = ["第一行。", "标题", "", "第三行！"]
    assert terminal_line_fraction(lines, "zh") == pytest.approx(2 / 3)
    assert terminal_line_fraction([], "zh") == 0.0


def test_english_table_is_what_the_filters_apply_today():
    en = load_language("en")
    # The sentence end the C4 step counted before it took its language's table (its regex then),
    # and the terminal punctuation of the C4/FineWeb steps, unchanged.
    before = re.compile(r"[.!?。！？]+(?:\s|$)")
    samples = ["One. Two!  Three?\nFour。 Five！", "x.y z... ok?", "no end", "中文。中文！", "a.\tb?"]
    for s in samples:
        assert en.sentence_end.findall(s) == before.findall(s)
    assert en.terminal_punctuation == filters.TERMINAL_PUNCT
    # Every threshold of the English table is the step's dataclass default.
    for step, options in en.steps.items():
        defaults = {f.name: (f.default if f.default_factory is dataclasses.MISSING else f.default_factory())
                    for f in dataclasses.fields(STEPS[step])}
        for key, value in options.items():
            assert defaults[key] == value, (step, key)
    assert en.step_options("gopher_quality")["stop_words"] == filters.GopherQuality().stop_words


@pytest.mark.parametrize("language", LANGUAGES)
def test_every_table_names_real_step_options(language):
    params = load_language(language)
    assert params.code == language and params.stop_words and params.terminal_punctuation
    for step, options in params.steps.items():
        fields = {f.name for f in dataclasses.fields(STEPS[step])}
        assert set(options) <= fields, (language, step, set(options) - fields)
        STEPS[step](**params.step_options(step))  # the values are accepted as they are


def test_chinese_thresholds_come_from_fineweb2():
    zh = load_language("cmn_Hani")
    assert zh.fineweb2 == "cmn_Hani" and zh.words == "character" and zh.ngram_scale == 1.75
    rep = zh.step_options("gopher_repetition")
    assert rep["top_ngram_max"][2] == 0.256 and rep["dup_ngram_max"][10] == 0.127 and rep["cjk_ngram_scale"] == 1.75
    assert zh.step_options("fineweb")["min_punct_line_ratio"] == 0.106
    assert "的" in zh.stop_words and "為" in zh.stop_words  # both scripts


def test_language_codes():
    assert canonical("zh-TW") == canonical("ZH") == canonical("zho") == "zh"
    assert canonical("jpn_Jpan") == "ja" and canonical("kor") == "ko" and canonical("eng") == "en"
    with pytest.raises(ValueError, match="no language table for 'fr'; known: en, zh, ja, ko"):
        load_language("fr")


@pytest.mark.parametrize("language, text, expected", [
    ("en", "The cat and the hat, with THE bat", 5),
    ("zh", "我的书在桌子上，他也有一本。", 5),       # 的 在 他 也 有
    ("zh", "機器學習的發展與應用", 2),               # 的 與: Traditional stop words count too
    ("ja", "私は東京に住んでいます", 3),             # は に で
    ("ko", "나는 학교에 갑니다", 0),                 # particles are inside whitespace words
])
def test_stop_words_per_language(language, text, expected):
    assert count_stop_words(text, language) == expected
    assert count_stop_words(text, language, at_most=1) == min(1, expected)
