"""prepare without --vocab-size: the vocabulary is chosen from the corpus size (`vocab_size_rule`,
the one rule); far-off sizes warn."""

from __future__ import annotations

import logging

import pytest

from gptforge.data.prepare import PrepareConfig, check_vocab_size, prepare
from gptforge.data.shards import load_meta
from gptforge.data.tokenizer import vocab_size_rule


@pytest.mark.parametrize("n_chars, expected", [
    (1_000, 512), (100_000, 1024), (1_000_000, 4096), (4_000_000, 8192), (16_000_000, 16384),
    (64_000_000, 32768), (10_000_000_000, 32768),
])
def test_documented_values(n_chars, expected):
    # ASCII: bytes are characters, the sizes the character rule gave.
    assert vocab_size_rule(n_chars) == expected


def test_far_off_size_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="gptforge.data"):
        assert check_vocab_size(32000, 2_000_000) == 32000
    assert "far from the 4096" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gptforge.data"):
        assert check_vocab_size(6000, 2_000_000) == 6000
    assert caplog.text == ""
    assert check_vocab_size(0, 2_000_000) == 4096


def test_prepare_without_vocab_size_uses_the_rule(tmp_path, stdlib_texts):
    src = tmp_path / "src"
    src.mkdir()
    for i, t in enumerate(stdlib_texts[:6]):
        (src / f"d{i}.txt").write_text(t)
    n_chars = sum(len(t) for t in stdlib_texts[:6])
    out = tmp_path / "out"
    prepare(PrepareConfig(inputs=[str(src)], out=str(out), val_fraction=0.2, workers=1), show_progress=False)
    meta = load_meta(out)
    # BPE may stop short of the target on a small corpus, never above it.
    assert 257 <= meta["vocab_size"] <= vocab_size_rule(n_chars) and vocab_size_rule(n_chars) < 32000


def test_vocab_size_counts_bytes_after_dedup(tmp_path, stdlib_texts, caplog):
    """Duplicates removed by dedup do not count: the size follows the tokenizer's training text."""
    src = tmp_path / "src"
    src.mkdir()
    kept = stdlib_texts[:12]
    for copy in range(4):
        for i, t in enumerate(kept):
            (src / f"c{copy}_d{i}.txt").write_text(t)
    once = sum(len(t.encode()) for t in kept)
    assert vocab_size_rule(4 * once) > vocab_size_rule(once)  # the rule tells the two counts apart
    with caplog.at_level(logging.INFO, logger="gptforge.data"):
        prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "out"), val_fraction=0.1, workers=1),
                show_progress=False)
    line = next(r.getMessage() for r in caplog.records if "chosen for" in r.getMessage())
    n = int(line.split("chosen for ")[1].split(" ")[0].replace(",", ""))
    assert " bytes (" in line and n <= once and line.startswith(f"vocabulary size {vocab_size_rule(n)} ")
    assert vocab_size_rule(n) < vocab_size_rule(4 * once)


# ---- the rule for any script (gptforge.data.tokenizer.vocab_size_rule) ---------------------------


@pytest.mark.parametrize("n_chars", [1_000, 100_000, 1_000_000, 4_000_000, 16_000_000, 64_000_000])
def test_bytes_rule_keeps_the_english_sizes(n_chars, stdlib_texts):
    from collections import Counter

    from gptforge.data.tokenizer import vocab_size_rule

    counts = Counter("".join(stdlib_texts[:3]).encode("ascii", "ignore").decode())
    # ASCII text: bytes are characters, and no character needs a merge to become one token.
    assert vocab_size_rule(n_chars, counts) == vocab_size_rule(n_chars)


def test_covering_merges():
    from gptforge.data.tokenizer import covering_merges

    assert covering_merges({"a": 100, "b": 5}) == 0
    # 999 of 1000 occurrences are covered by the first three characters: 2 + 2 + 1 merges.
    assert covering_merges({"的": 600, "是": 300, "é": 99, "罕": 1}) == 5
    assert covering_merges({"的": 600, "是": 300, "é": 99, "罕": 1}, coverage=1.0) == 7
    assert covering_merges({}) == 0


def test_chinese_gets_a_larger_vocabulary_than_the_character_rule():
    from collections import Counter

    from gptforge.data.tokenizer import vocab_size_rule

    # 1.83 M characters of Chinese are 5.5 MB: the old character rule (4*sqrt(characters)) gave 4096.
    n_chars = 1_830_000
    assert vocab_size_rule(n_chars) == 4096
    assert vocab_size_rule(3 * n_chars) == 8192
    # With 3,000 Han characters to cover (6,000 merges), room for them and as many words.
    counts = Counter({chr(0x4E00 + i): 1000 for i in range(3000)})
    assert vocab_size_rule(3 * n_chars, counts) == 16384
    # On a small corpus the characters add at most a factor of two: 4 * sqrt(10 kB) = 400 -> 1024, not 16384.
    assert vocab_size_rule(10_000) == 512 and vocab_size_rule(10_000, counts) == 1024
