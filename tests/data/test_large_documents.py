"""Huge single documents: bounded pieces for tokenization and MinHash, same results (issue 15 item 16)."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from gptforge.data.text_stats import whitespace_pieces


def _mixed_text(stdlib_texts, copies=3):
    extra = "  double  spaces\n\n\nnewlines\ttabs 3.14 ünïcödé 中文字符 emoji 🎉 don't it's   \n"
    return (extra.join(stdlib_texts[:30]) + extra) * copies


def test_pieces_join_back_and_are_bounded(stdlib_texts):
    text = _mixed_text(stdlib_texts)
    pieces = list(whitespace_pieces(text, 2000))
    assert "".join(pieces) == text
    assert len(pieces) > 10
    assert max(map(len, pieces)) <= 2000
    for a, b in pairwise(pieces):
        assert not a[-1].isspace() and b[0] in " \n"  # cut where a whitespace run starts


def test_no_whitespace_is_cut_at_a_hard_limit():
    text = "x" * 10_000
    pieces = list(whitespace_pieces(text, 1000))
    assert "".join(pieces) == text and max(map(len, pieces)) <= 4000


def test_tokens_are_the_same_as_for_the_whole_text(stdlib_texts, small_tokenizer):
    from gptforge.data.phases import encode as prep

    text = _mixed_text(stdlib_texts)
    whole = np.array(small_tokenizer.encode(text), dtype=np.int64)
    old = prep.TOKENIZE_PIECE_CHARS
    prep.TOKENIZE_PIECE_CHARS = 1500
    try:
        ids, nbytes, lengths = prep.encode_documents(small_tokenizer, [text, "short one"], np.dtype("<u2"))
    finally:
        prep.TOKENIZE_PIECE_CHARS = old
    assert lengths[0] == len(whole)
    np.testing.assert_array_equal(ids[: len(whole)].astype(np.int64), whole)
    assert ids[len(whole)] == small_tokenizer.eos_id
    assert nbytes == len(text.encode()) + len(b"short one")


@pytest.mark.parametrize("simplify", [True, False])
def test_streamed_minhash_equals_the_whole_documents(stdlib_texts, simplify):
    from gptforge.data import dedup

    texts = [_mixed_text(stdlib_texts, 2), "a b c d e f g", "too short"]
    whole = dedup.minhash_signatures(texts, 112, 5, 1, simplify, True)
    old = dedup.MINHASH_PIECE_CHARS
    dedup.MINHASH_PIECE_CHARS = 3000
    try:
        streamed = dedup.minhash_signatures(texts, 112, 5, 1, simplify, True)
    finally:
        dedup.MINHASH_PIECE_CHARS = old
    np.testing.assert_array_equal(streamed, whole)


PEAK_SCRIPT = r"""
import random, resource, sys
from pathlib import Path
out = Path(sys.argv[1])
rng = random.Random(0)
words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(40)) for _ in range(20)]
line = " ".join(rng.choice(words) for _ in range(5000)) + " "
src = out / "one_line.txt"
with open(src, "w") as f:  # 50 MB, one line, no newline: one document
    for _ in range((50 << 20) // len(line)):
        f.write(line)
from gptforge.data.tokenizer import train_bpe
train_bpe([line] * 3, 600).save(out / "tok.json")
from gptforge.data.prepare import PrepareConfig, prepare
prepare(PrepareConfig(inputs=[str(src)], out=str(out / "data"), tokenizer=str(out / "tok.json"), workers=1,
                      recipe="default"), show_progress=False)
print(src.stat().st_size, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


@pytest.mark.slow
@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="ru_maxrss is in KiB on Linux")
def test_a_50_mb_single_line_document_stays_within_the_memory_bound(tmp_path):
    import subprocess
    import sys

    from gptforge.data.prepare import MEMORY_BASE_MB, MEMORY_BYTES_PER_CHAR
    from gptforge.data.shards import load_meta

    proc = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    size, peak_kib = map(int, proc.stdout.split()[-2:])
    bound_mb = MEMORY_BASE_MB + MEMORY_BYTES_PER_CHAR * size / 2**20
    assert peak_kib / 1024 < bound_mb, f"peak RSS {peak_kib / 1024:.0f} MB > bound {bound_mb:.0f} MB"
    meta = load_meta(tmp_path / "data")
    assert meta["splits"]["train"]["documents"] == 1  # one document (val cut from its end)
    assert meta["splits"]["train"]["bytes"] + meta["splits"]["val"]["bytes"] == size
