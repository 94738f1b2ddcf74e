"""Chinese word units for the quality filters: jieba words or characters (issue 24, item 1).

FineWeb 2's cmn_Hani thresholds were measured on jieba words. This prints the figures behind
gptforge's choice of characters (gptforge/data/languages):

- segmentation speed: jieba's default mode against `text_stats.words` (one thread, MB/s of
  UTF-8 input), jieba's dictionary load time apart;
- characters per jieba word (all words, and words of Han characters only);
- Gopher's repetition fractions on documents with a controlled share of repeated sentences:
  the top word 2/3/4-gram and the duplicated 5..10-gram character fractions on jieba words
  with windows of n words, against characters with windows of 2n characters, and how often
  FineWeb 2's cmn_Hani thresholds decide the same way on both (keep/drop agreement).

Input: Chinese .txt files given on the command line, else the Chinese guides in
../shared/data/zh_guides beside the repository (the script stops with a message when neither is
there). Needs jieba (pip install jieba).

Usage: python bench/zh_word_units.py [FILE.txt ...]
"""

from __future__ import annotations

import logging
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machine import cpu_description  # noqa: E402

from gptforge.data.languages import load_language  # noqa: E402
from gptforge.data.repetition import NgramStats  # noqa: E402
from gptforge.data.text_stats import words  # noqa: E402

_SENT = re.compile(r"[^。！？\n]+[。！？]")
_HAN = re.compile(r"[\u4e00-\u9fff]+$")
_WORDLIKE = re.compile(r"\w")


def jieba_words(jieba, text: str) -> list[str]:
    return [w for w in jieba.cut(text) if _WORDLIKE.search(w)]


def rule_breaks(fractions_top, fractions_dup, zh) -> bool:
    rep = zh.step_options("gopher_repetition")
    return (any(fractions_top[n] > v for n, v in rep["top_ngram_max"].items())
            or any(fractions_dup[n] > v for n, v in rep["dup_ngram_max"].items()))


def main(argv: list[str]) -> int:
    try:
        import jieba
    except ImportError:
        print("needs jieba: pip install jieba")
        return 1
    jieba.setLogLevel(logging.WARNING)
    files = [Path(a) for a in argv] or sorted((Path(__file__).resolve().parents[2] / "shared" / "data" /
                                               "zh_guides").glob("*.txt"))
    if not files:
        print("no input: give Chinese .txt files, or put the guides in ../shared/data/zh_guides")
        return 1
    text = "\n".join(f.read_text(encoding="utf-8") for f in files)
    print(cpu_description())
    print(f"input: {len(files)} file(s), {len(text):,} characters, {len(text.encode()):,} bytes")
    t = time.perf_counter()
    jieba.initialize()
    print(f"jieba dictionary load: {time.perf_counter() - t:.2f} s")
    big = (text + "\n") * max(1, 2_000_000 // max(1, len(text.encode())))
    mb = len(big.encode()) / 1e6
    t = time.perf_counter()
    jw = jieba_words(jieba, big)
    tj = time.perf_counter() - t
    t = time.perf_counter()
    cw = words(big + " ")
    tc = time.perf_counter() - t
    print(f"segmentation, one thread: jieba {mb / tj:.2f} MB/s, characters {mb / tc:.2f} MB/s ({tj / tc:.0f}x)")
    han = [w for w in jw if _HAN.match(w)]
    print(f"characters per jieba word: {len(cw) / len(jw):.2f} (all words), "
          f"{sum(map(len, han)) / len(han):.2f} (Han words)")

    zh = load_language("zh")
    sentences = _SENT.findall(text)
    rng = random.Random(0)
    scales = (1.5, 1.75, 2.0)
    agree = dict.fromkeys(scales, 0)
    total = 0
    rows = []
    for share in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5):
        for _ in range(20):
            n = min(len(sentences), 40)
            start = rng.randrange(0, max(1, len(sentences) - n))
            doc = sentences[start:start + n]
            for i in rng.sample(range(1, n), int(share * n)):  # sentence i becomes an earlier one
                doc[i] = doc[rng.randrange(0, i)]
            doc_text = "".join(doc)
            gj, gc = NgramStats(jieba_words(jieba, doc_text)), NgramStats(words(doc_text))
            top_j = {k: gj.top_fraction(k) for k in (2, 3, 4)}
            dup_j = {k: gj.duplicate_fraction(k) for k in range(5, 11)}
            for scale in scales:
                top_s = {k: gc.top_fraction(round(scale * k)) for k in (2, 3, 4)}
                dup_s = {k: gc.duplicate_fraction(round(scale * k)) for k in range(5, 11)}
                agree[scale] += rule_breaks(top_j, dup_j, zh) == rule_breaks(top_s, dup_s, zh)
            top_c = {k: gc.top_fraction(2 * k) for k in (2, 3, 4)}
            dup_c = {k: gc.duplicate_fraction(2 * k) for k in range(5, 11)}
            total += 1
            rows.append((share, top_j[2], top_c[2], dup_j[5], dup_c[5], dup_j[10], dup_c[10]))
    print("repeated-sentence share | top 2-gram jieba / chars(4) | dup 5-gram jieba / chars(10) | "
          "dup 10-gram jieba / chars(20)   (means of 20 documents)")
    for share in sorted({r[0] for r in rows}):
        sel = [r for r in rows if r[0] == share]
        m = [sum(r[i] for r in sel) / len(sel) for i in range(1, 7)]
        print(f"  {share:.1f} | {m[0]:.3f} / {m[1]:.3f} | {m[2]:.3f} / {m[3]:.3f} | {m[4]:.3f} / {m[5]:.3f}")
    for scale in scales:
        print(f"cmn_Hani repetition thresholds, character windows of round({scale} n): decide as on jieba words "
              f"for {agree[scale]}/{total} documents ({agree[scale] / total:.0%})")
    print(f"load average: {open('/proc/loadavg').read().split()[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
