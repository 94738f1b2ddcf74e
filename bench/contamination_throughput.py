"""Contamination check speed: GB of token shards per minute and peak memory, one streaming pass.

Builds a shard folder here (a tokenizer and real tokens from standard-library source by
`gptforge prepare`, then the train split tiled up to --gb gigabytes of uint16 tokens, with every
copy's tokens shifted so copies do not repeat), 1,000 evaluation examples of 60 tokens (half cut
from the training data, half random), and times `find_contamination` over it.

    python bench/contamination_throughput.py [--gb 1.0] [--ngram 13]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.eval_throughput import cpu_name  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.0, help="Size of the train split in GB (uint16 tokens).")
    ap.add_argument("--ngram", type=int, default=13)
    args = ap.parse_args()
    from gptforge.data.prepare import PrepareConfig, prepare
    from gptforge.data.stdlib_corpus import stdlib_files
    from gptforge.eval.contamination import find_contamination

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        prepare(PrepareConfig(inputs=[str(p) for p in stdlib_files()[::20][:40]], out=str(data), vocab_size=4096,
                              val_fraction=0.05, workers=1), show_progress=False)
        meta = json.loads((data / "meta.json").read_text())
        base = np.fromfile(data / meta["splits"]["train"]["files"][0], dtype=np.uint16)
        total = int(args.gb * 1e9 // 2)
        with open(data / "train_000.bin", "wb") as f:
            written, copy = 0, 0
            while written < total:
                part = ((base.astype(np.int64) + copy * 7) % meta["vocab_size"]).astype(np.uint16)[: total - written]
                part.tofile(f)
                written += len(part)
                copy += 1
        meta["splits"]["train"]["files"] = ["train_000.bin"]
        meta["splits"]["train"]["tokens"] = total
        (data / "meta.json").write_text(json.dumps(meta))
        rng = np.random.default_rng(0)
        train = np.memmap(data / "train_000.bin", dtype=np.uint16, mode="r")
        examples = [train[s:s + 60].tolist() for s in rng.integers(0, total - 60, 500)]
        examples += [rng.integers(0, meta["vocab_size"], 60).tolist() for _ in range(500)]
        del train
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        rep = find_contamination({"bench": examples}, data, n=args.ngram)
        dt = time.perf_counter() - t0
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    gb = total * 2 / 1e9
    found = len(rep.contaminated["bench"])
    print(f"CPU: {cpu_name()}")
    print(f"train split: {gb:.2f} GB ({total:,} uint16 tokens), {len(examples)} examples, {args.ngram}-grams")
    print(f"time {dt:.1f} s -> {gb / dt * 60:.2f} GB/minute; contaminated found {found} (expected >= 500)")
    print(f"peak RSS {rss1 / 1024:.0f} MiB (before the check {rss0 / 1024:.0f} MiB; chunk 4M tokens)")
    return 0 if found >= 500 else 1


if __name__ == "__main__":
    raise SystemExit(main())
