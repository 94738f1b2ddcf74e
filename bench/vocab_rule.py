"""Evidence for the vocabulary rule (gptforge.data.tokenizer.vocab_size_rule; issue 24 item 4).

Trains byte-level BPE tokenizers of several sizes on one text file and prints, per size, the
characters and bytes per token on a held-out file and how many of the characters covering
99.9% of the non-ASCII occurrences became single tokens; then the size the old character rule
(4 * sqrt(characters)) and `vocab_size_rule` choose for the training text.

Input: any UTF-8 text, e.g. the modern Chinese prose of Debian's manpages-zh and
debian-reference-zh-cn packages (`apt-get download`, `dpkg-deb -x`, text extracted; licences
GFDL-1.2+ and GPL-2+: measure, never commit). Lines are the training documents.

Usage: python bench/vocab_rule.py TRAIN.txt HELDOUT.txt [--sizes 2048 4096 8192 16384]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machine import cpu_description  # noqa: E402
from tokenizers import pre_tokenizers  # noqa: E402

from gptforge.data.tokenizer import CHARACTER_COVERAGE, train_bpe, vocab_size_rule  # noqa: E402


def covering_characters(counts: Counter) -> list[str]:
    """The most frequent non-ASCII characters covering CHARACTER_COVERAGE of their occurrences."""
    ranked = [(n, c) for c, n in counts.most_common() if ord(c) > 127]
    total = sum(n for n, _ in ranked)
    out, covered = [], 0
    for n, c in ranked:
        if covered >= CHARACTER_COVERAGE * total:
            break
        covered += n
        out.append(c)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("train")
    ap.add_argument("heldout")
    ap.add_argument("--sizes", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    args = ap.parse_args()
    train = Path(args.train).read_text(encoding="utf-8")
    held = Path(args.heldout).read_text(encoding="utf-8")
    counts = Counter(train)
    cover = covering_characters(counts)
    n_bytes = len(train.encode("utf-8"))
    print(cpu_description())
    print(f"train: {len(train):,} characters, {n_bytes:,} bytes; {len(cover):,} characters cover "
          f"{CHARACTER_COVERAGE:.1%} of the non-ASCII occurrences; held-out: {len(held):,} characters")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    docs = [ln for ln in train.split("\n") if ln.strip()]
    for size in args.sizes:
        t = time.perf_counter()
        tok = train_bpe(docs, vocab_size=size)
        vocab = tok._hf.get_vocab()
        whole = sum(byte_level.pre_tokenize_str(c)[0][0] in vocab for c in cover)
        n = len(tok.encode(held))
        print(f"  vocab {size:6d}: held-out {len(held) / n:.3f} characters/token, {len(held.encode()) / n:.3f} "
              f"bytes/token; {whole}/{len(cover)} covering characters are one token ({whole / max(1, len(cover)):.0%}); "
              f"trained in {time.perf_counter() - t:.0f} s")
    old = int(min(32768, max(512, 2 ** round(math.log2(4 * math.sqrt(len(train)))))))
    print(f"character rule 4*sqrt(chars): {old}; vocab_size_rule: {vocab_size_rule(n_bytes, counts)}")
    print(f"load average: {open('/proc/loadavg').read().split()[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
