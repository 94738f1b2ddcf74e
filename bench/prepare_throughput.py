"""Throughput of `gptforge prepare` curation: documents/s and MB/s per worker, default and web recipes.

Input: all the distinct real text at hand, the shared data folder beside the repository
(`../shared/data`, when present) and the Python standard library's sources; nothing is copied
to pad it (dedup would remove copies). A tokenizer is trained once up front so that the figures
are about curation and encoding, not BPE training.

Usage: python bench/prepare_throughput.py [--workers 1 2] [--recipes default web] [--max-mb 25]

Not done yet: the datatrove chain side by side (issue 3); this prints our figures alone.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import tempfile
import time
from pathlib import Path


def corpus_files(max_mb: float) -> list[Path]:
    from gptforge.data.stdlib_corpus import stdlib_files

    shared = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
    files = sorted(p for p in shared.rglob("*") if p.is_file() and p.suffix in (".txt", ".md")) if shared.is_dir() else []
    files += stdlib_files()
    out, total = [], 0
    for f in files:
        size = f.stat().st_size
        if total + size > max_mb * 1e6:
            break
        out.append(f)
        total += size
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--recipes", nargs="+", default=["default", "web"])
    ap.add_argument("--max-mb", type=float, default=25.0)
    args = ap.parse_args()
    logging.getLogger("gptforge.data").setLevel(logging.ERROR)
    from gptforge.data.prepare import PrepareConfig, prepare
    from gptforge.data.tokenizer import train_bpe

    files = corpus_files(args.max_mb)
    mb = sum(f.stat().st_size for f in files) / 1e6
    print(f"corpus: {len(files)} files, {mb:.1f} MB")
    tmp = Path(tempfile.mkdtemp(prefix="gptforge-bench-"))
    try:
        tok = train_bpe((f.read_text(errors="replace") for f in files[:300]), vocab_size=4096)
        tok.save(tmp / "tok.json")
        print(f"{'recipe':8} {'workers':>7} {'docs/s':>9} {'MB/s':>7} {'MB/s/worker':>11} {'curate s':>9} "
              f"{'tokenize s':>10} {'tokens/s':>10} {'total s':>8} {'kept docs':>9}")
        for recipe in args.recipes:
            for w in args.workers:
                t0 = time.perf_counter()
                r = prepare(PrepareConfig(inputs=[str(f) for f in files], out=str(tmp / f"o-{recipe}-{w}"),
                                          tokenizer=str(tmp / "tok.json"), workers=w, recipe=recipe,
                                          shard_bytes=2_000_000), show_progress=False)
                total = time.perf_counter() - t0
                rep = r.report
                cur = rep["throughput"]["curate"]["seconds"] + rep["throughput"].get("count_lines", {}).get("seconds", 0)
                docs = rep["check"]["documents_read"]
                print(f"{recipe:8} {w:>7} {docs / cur:>9.1f} {mb / cur:>7.2f} {mb / cur / w:>11.2f} {cur:>9.1f} "
                      f"{rep['throughput']['tokenize']['seconds']:>10.1f} "
                      f"{rep['throughput']['tokenize'].get('tokens_per_second', 0):>10.0f} {total:>8.1f} "
                      f"{rep['check']['documents_written']:>9}")
        try:
            import datatrove  # noqa: F401
            print("datatrove is installed, but the side-by-side datatrove chain is not written yet")
        except ImportError:
            print("datatrove not installed: our figures only (pip install datatrove to compare, once written)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
