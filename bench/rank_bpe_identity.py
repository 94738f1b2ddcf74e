"""Does tiktoken, with a trained BPE's ranks, give the Hugging Face tokenizer's ids? (issue 40)

For each corpus folder (every .txt/.md file under it, whole): trains a byte-level BPE on all of
it (`train_bpe`, the vocabulary `vocab_size_rule` gives its bytes and characters, as prepare
sizes one), then compares the ids of `tokenizers`' `encode_batch_fast` (what
`Tokenizer.encode_batch` calls) with tiktoken's `encode_ordinary` on the rank table
`gptforge.data.rank_bpe.rank_table` builds, one text per file, and prints:

- whether `rank_table` accepts the tokenizer (else the reason) and how many tokens can be split
  into two tokens other than by their merge (where the two rules could differ at all);
- texts with different ids (and the first difference), tokens in all, and the CPU seconds and
  MB/s per core of each encoder on one thread in the same run, with the load average;
- the same comparison on every token's own text, on `--random` concatenations of 2-4 tokens
  (half of them drawn from the tokens with such other splits) and on every Unicode code point
  but the surrogates in 14 contexts (letters, digits, spaces, newline, tab, apostrophe): the
  pre-tokenization regex of both, Oniguruma's in `tokenizers` and fancy-regex's in tiktoken.

Usage: python bench/rank_bpe_identity.py DIR [DIR ...] [--random 300000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from machine import cpu_description  # noqa: E402

from gptforge.data.rank_bpe import GPT2_PATTERN, rank_table  # noqa: E402
from gptforge.data.tokenizer import Tokenizer, token_bytes, train_bpe, vocab_size_rule  # noqa: E402


def compare(hf, enc, texts: list[str]) -> tuple[int, str, float, float, int]:
    """(texts whose ids differ, the first difference, HF CPU s, tiktoken CPU s, tokens)."""
    c = time.process_time()
    a = [e.ids for e in hf.encode_batch_fast(texts, add_special_tokens=False)]
    hf_s = time.process_time() - c
    c = time.process_time()
    b = [enc.encode_ordinary(t) for t in texts]
    tk_s = time.process_time() - c
    diffs = [k for k in range(len(texts)) if a[k] != b[k]]
    first = ""
    if diffs:
        x, y = a[diffs[0]], b[diffs[0]]
        j = next((i for i in range(min(len(x), len(y))) if x[i] != y[i]), min(len(x), len(y)))
        first = f"text {diffs[0]} token {j}: HF {x[j:j + 4]}, tiktoken {y[j:j + 4]}"
    return len(diffs), first, hf_s, tk_s, sum(map(len, a))


def check(folder: Path, n_random: int) -> None:
    import tiktoken

    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in (".txt", ".md"))
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    counts: Counter[str] = Counter()
    for t in texts:
        counts.update(t)
    vocab = vocab_size_rule(n_bytes, counts)
    c = time.process_time()
    tok: Tokenizer = train_bpe(texts, vocab)
    print(f"\n### {folder.name}: {len(files)} files, {n_bytes / 1e6:.2f} MB, vocabulary {vocab} "
          f"(trained in {time.process_time() - c:.1f} CPU s)")
    table = rank_table(tok)
    if table.ranks is None:
        print(f"rank_table refuses it: {table.reason}")
        return
    ranks = table.ranks
    merge_of = {}
    for m in json.loads(tok.to_str())["model"]["merges"]:
        a, b = (token_bytes(x) or b"" for x in (m.split(" ") if isinstance(m, str) else m))
        merge_of[a + b] = (a, b)
    other = [t for t in ranks if len(t) > 1 and any(
        t[:k] in ranks and t[k:] in ranks and merge_of.get(t) != (t[:k], t[k:]) for k in range(1, len(t)))]
    print(f"rank_table accepts it; {len(other):,} of {len(ranks):,} tokens also split into two tokens other "
          f"than their merge (where the two rules could differ)")
    enc = tiktoken.Encoding(name="check", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={})
    hf = tok._hf
    n, first, hf_s, tk_s, tokens = compare(hf, enc, texts)
    mb = n_bytes / 1e6
    print(f"corpus texts: {n} of {len(texts)} differ {first}; {tokens:,} tokens; HF {hf_s:.2f} CPU s "
          f"({mb / hf_s:.2f} MB/s per core), tiktoken {tk_s:.2f} CPU s ({mb / tk_s:.2f} MB/s per core), "
          f"{hf_s / tk_s:.2f}x; load {os.getloadavg()[0]:.1f}", flush=True)
    own = []
    for t in ranks:
        try:
            own.append(t.decode("utf-8"))
        except UnicodeDecodeError:
            pass
    n, first, *_ = compare(hf, enc, own)
    print(f"tokens' own texts (valid UTF-8): {n} of {len(own)} differ {first}")
    rng = random.Random(0)
    pool, many = list(ranks), other or list(ranks)
    cat = []
    while len(cat) < n_random:
        parts = [rng.choice(many if rng.random() < 0.5 else pool) for _ in range(rng.randint(2, 4))]
        try:
            cat.append(b"".join(parts).decode("utf-8"))
        except UnicodeDecodeError:
            pass
    n, first, *_ = compare(hf, enc, cat)
    print(f"random concatenations of 2-4 tokens: {n} of {len(cat)} differ {first}")
    points = [chr(c) for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF]
    n_diff = 0
    for k in range(0, len(points), 50000):
        n, first, *_ = compare(hf, enc, [f"a{c}b {c}1 {c}{c}'s\n{c} \t{c}  x{c}1{c}" for c in points[k:k + 50000]])
        n_diff += n
    print(f"code points in 14 contexts: {n_diff} of {len(points)} differ", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--random", type=int, default=300000)
    args = ap.parse_args()
    print(cpu_description())
    for folder in args.folders:
        check(folder, args.random)


if __name__ == "__main__":
    main()
