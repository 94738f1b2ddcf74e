"""Quality filters on hand-written documents at both sides of each threshold; CJK kept."""

from __future__ import annotations

import pytest

from gptforge.data.filters import (
    Blocklist,
    C4Quality,
    FineWebQuality,
    GopherQuality,
)
from gptforge.data.readers import Document
from gptforge.data.repetition import GopherRepetition, duplicate_ngram_char_fraction, top_ngram_char_fraction
from gptforge.data.text_stats import words

SENT = "The quick brown fox jumps over the lazy dog and then it runs to the river with the others."


def _doc(text):
    return Document(text, "x")


VOCAB = ("the of and to with that have be history science people wanted know things work why happen "
         "way others waited better tools river mountain letter garden window morning evening village "
         "market teacher student story reason answer question number color animal summer winter "
         "season bridge island forest valley ocean harbor castle engine pencil basket kitchen").split()


def _prose(n_words: int, seed: int = 0) -> str:
    """Random words from a 60-word vocabulary: prose-like statistics, no repeated long n-grams."""
    import random

    rng = random.Random(seed)
    return " ".join(rng.choice(VOCAB) for _ in range(n_words))


def test_gopher_word_count_bounds():
    g = GopherQuality()
    assert g.check(_prose(49)) == "too_few_words"
    assert g.check(_prose(50)) is None
    assert GopherQuality(max_words=60).check(_prose(61)) == "too_many_words"
    assert GopherQuality(min_words=10, min_stop_words=0).check(_prose(10)) is None


def test_gopher_mean_word_length_and_symbols():
    g = GopherQuality()
    short = " ".join(["a to be of the"] * 20)  # mean length 2.0
    assert g.check(short) == "mean_word_length_low"
    long = " ".join(["extraordinarily the uncharacteristically magnificently"] * 20)
    assert g.check(long) == "mean_word_length_high"
    text = _prose(100)
    assert g.check(text + " #" * 10) is None  # 10 symbols / 110 tokens < 0.1
    assert g.check(text + " #" * 12) == "symbol_word_ratio"  # 12 / 112 > 0.1


def test_gopher_lines_alpha_and_stop_words():
    g = GopherQuality()
    bullets = "\n".join(f"- {SENT}" for _ in range(10))
    assert g.check(bullets) == "bullet_lines"
    assert g.check(bullets + "\n" + SENT + "\n" + SENT) is None  # 10/12 = 0.83 < 0.9
    ell = "\n".join([SENT + " ..."] * 4 + [SENT] * 6)
    assert g.check(ell) == "ellipsis_lines"  # 0.4 > 0.3
    assert g.check("\n".join([SENT + " ..."] * 3 + [SENT] * 7)) is None
    numbers = _prose(60) + " " + " ".join(["12345"] * 20)  # 20/80 = 25% non-alphabetic
    assert g.check(numbers) == "alpha_words_ratio"
    no_stop = " ".join(["science history people things works happen tools others waited"] * 8)
    assert g.check(no_stop) == "stop_words"
    assert g.check(no_stop + " the and") is None


def test_cjk_text_not_dropped_by_word_filters():
    zh = ("自然语言处理是计算机科学领域与人工智能领域中的一个重要方向。它研究能实现人与计算机之间用自然语言进行有效通信的各种理论和方法。"
          "自然语言处理是一门融语言学、计算机科学、数学于一体的科学。")
    ja = "吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。何でも薄暗いじめじめした所でニャーニャー泣いていた事だけは記憶している。"
    for text in (zh, ja):
        assert len(words(text)) >= 50
        assert GopherQuality().check(text) is None
        assert GopherRepetition().check(text) is None


def test_gopher_repetition_lines_and_paragraphs():
    r = GopherRepetition()
    lines = [_prose(10, seed=i) for i in range(10)]
    assert r.check("\n".join(lines)) is None
    assert r.check("\n".join(lines + lines[:5])) == "dup_line_fraction"  # 5/15 = 0.33 > 0.30
    assert r.check("\n".join(lines + lines[:4])) == "dup_line_char_fraction"  # 4/14 = 0.29, chars 0.29 > 0.2
    paras = "\n\n".join(lines + lines[:4])
    assert r.check(paras) in ("dup_para_char_fraction", "dup_para_fraction")
    assert GopherRepetition(max_dup_line_char_fraction=1, max_dup_para_char_fraction=1, dup_ngram_max={}).check(
        "\n".join(lines + lines[:3])) is None  # 3/13 = 0.23 < 0.30 by count


def test_ngram_fractions():
    ws = "a b a b a b c".split()
    assert abs(top_ngram_char_fraction(ws, 2) - 3 * 2 / 7) < 1e-9  # "a b" x3, 2 chars each
    assert duplicate_ngram_char_fraction("x y z w x y z".split(), 3) == 6 / 7
    assert duplicate_ngram_char_fraction("x y z w v u t".split(), 3) == 0.0
    r = GopherRepetition()
    spam = _prose(80) + " " + " ".join(["buy cheap watches now"] * 10)
    assert r.check(spam) is not None
    assert r.check(_prose(200)) is None


def test_c4_lines_and_page():
    c4 = C4Quality()
    good = "\n".join([SENT] * 3 + ["Another complete sentence is here.", "And one more sentence ends now!"])
    kept = c4(_doc(good + "\nMenu\nHome | About\nPlease enable JavaScript to view this page.\nRead our privacy policy."))
    assert isinstance(kept, Document) and kept.text == good
    assert c4.counts["line_no_terminal_punct"] == 2 and c4.counts["line_javascript"] == 1
    assert c4.counts["line_policy"] == 1
    assert c4(_doc("\n".join([SENT] * 4))) == "few_sentences"
    assert c4(_doc(good + "\nlorem ipsum dolor sit amet.")) == "lorem_ipsum"
    assert c4(_doc(good + "\nfunction f() { return 1; }.")) == "curly_bracket"
    cited = c4(_doc(good.replace("dog", "dog[1]")))
    assert "[1]" not in cited.text


def test_fineweb_rules():
    f = FineWebQuality()
    prose = "\n".join(f"{SENT} Number {i}." for i in range(10))
    assert f.check(prose) is None
    no_punct = "\n".join(f"{SENT} number {i} without an end" for i in range(10))
    assert f.check(no_punct) == "punct_line_ratio"
    mostly_no = "\n".join([f"{SENT} {i} no end" for i in range(8)] + [SENT, SENT + " x."])
    assert f.check(mostly_no) is None  # 2/10 = 0.2 > 0.12
    dup = prose + "\n" + "\n".join([f"{SENT} Number 1."] * 2)
    assert f.check(dup) == "dup_line_char_ratio"
    short = "\n".join([f"Short line {i}." for i in range(9)] + [SENT])
    assert f.check(short) == "short_line_ratio"


def test_blocklist(tmp_path):
    p = tmp_path / "block.txt"
    p.write_text("# comment\nbadword\ndomain:spam.example\n")
    b = Blocklist(path=str(p))
    assert b(_doc("this has a BadWord inside")) == "blocked"
    assert b(_doc("badwords is another word")) != "blocked"
    assert b(_doc("see https://www.spam.example/page")) == "blocked"
    assert b(_doc("see https://notspam.example/page")).text
    flag = Blocklist(words=["badword"], action="flag")
    out = flag(_doc("badword"))
    assert out.metadata["blocklist"] == "badword" and flag.counts["flagged"] == 1
    assert Blocklist()(_doc("anything")) == _doc("anything")


def _ref_top(ws, n):
    from collections import Counter

    total = sum(map(len, ws))
    if len(ws) < n or not total:
        return 0.0
    gram, count = Counter(tuple(ws[i:i + n]) for i in range(len(ws) - n + 1)).most_common(1)[0]
    return 0.0 if count <= 1 else min(1.0, sum(map(len, gram)) * count / total)


def _ref_dup(ws, n):
    total = sum(map(len, ws))
    if len(ws) < n or not total:
        return 0.0
    grams = [tuple(ws[i:i + n]) for i in range(len(ws) - n + 1)]
    counts = {}
    for g in grams:
        counts[g] = counts.get(g, 0) + 1
    covered = [False] * len(ws)
    for i, g in enumerate(grams):
        if counts[g] > 1:
            covered[i:i + n] = [True] * n
    return sum(len(w) for w, c in zip(ws, covered, strict=True) if c) / total


def test_vectorized_ngram_stats_equal_plain_python(stdlib_texts):
    from gptforge.data.repetition import NgramStats
    from gptforge.data.text_stats import words

    docs = [words(t) for t in stdlib_texts[:15]] + [["a", "b"] * 40 + ["c"], ["x"], []]
    for ws in docs:
        st = NgramStats(ws)
        for n in (1, 2, 3, 4):
            assert st.top_fraction(n) == pytest.approx(_ref_top(ws, n), abs=1e-12)
        for n in (2, 5, 8, 10):
            assert st.duplicate_fraction(n) == pytest.approx(_ref_dup(ws, n), abs=1e-12)
