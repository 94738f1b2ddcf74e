"""PII redaction: false positives on random order numbers, and `PIIRedactor().redact` speed.

Printed:
- of 10,000 random 11-19 digit numbers after "订单号" / "Order" (seed 0), how many lines were
  changed, per 10,000, and which kinds took them;
- MB/s (UTF-8 input) of one `redact` call over mixed text: the shared data folder beside the
  repository (`../shared/data`, .txt/.md, when present) and the standard library's sources, up
  to `--max-mb`, plus generated lines dense in PII (e-mail, phones, IPs, order numbers); the best
  and median CPU seconds of `--repeat` calls, and the 1-minute load average.

Usage: python bench/pii_redaction.py [--max-mb 4] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import cpu_description  # noqa: E402
from bench.prepare_throughput import corpus_files  # noqa: E402
from gptforge.data.pii import PIIRedactor  # noqa: E402


def order_number_lines(n: int, seed: int) -> list[str]:
    """`n` lines, each a random 11-19 digit number (first digit 1-9) after 订单号 or Order."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        digits = str(rng.randint(1, 9)) + "".join(str(rng.randint(0, 9)) for _ in range(rng.randint(10, 18)))
        lines.append(f"订单号 {digits} 已发货" if i % 2 else f"Order {digits} shipped")
    return lines


def mixed_text(max_mb: float, seed: int) -> str:
    """Real text up to `max_mb` MB and 8,000 generated lines holding PII and ordinary numbers."""
    parts = [p.read_text(encoding="utf-8", errors="replace") for p in corpus_files(max_mb)]
    rng = random.Random(seed)
    parts += [f"Contact a{i}@example.com or call +1 415-555-{i % 10000:04d}, 订单号 "
              f"{rng.randint(10**12, 10**18)}, ip 10.0.{i % 250}.{i % 200}, 电话 010-6234{i % 10000:04d}, "
              f"score {i} {i * 3} {i * 7}" for i in range(8000)]
    return "\n".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-mb", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(cpu_description())
    kinds: Counter = Counter()
    changed = 0
    for line in order_number_lines(10_000, seed=0):
        r = PIIRedactor()
        if r.redact(line) != line:
            changed += 1
            kinds.update(r.counts)
    print(f"random order numbers: {changed} of 10,000 lines changed; kinds {dict(kinds)}")
    text = mixed_text(args.max_mb, seed=0)
    mb = len(text.encode()) / 1e6
    seconds = []
    for _ in range(args.repeat):
        t0 = time.process_time()
        PIIRedactor().redact(text)
        seconds.append(time.process_time() - t0)
    best, median = min(seconds), statistics.median(seconds)
    print(f"redact: {mb:.1f} MB, CPU s best {best:.2f} median {median:.2f}, {mb / best:.1f} MB/s (best), "
          f"{mb / median:.1f} MB/s (median); load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
