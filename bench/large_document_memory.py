"""Peak memory of `prepare` on one huge single-line document (issue 15 item 16).

Generates an N MB one-line .txt (one document: no newline, no --doc-separator), runs `prepare`
on it in a fresh process (recipe default: clean, PII, exact + near dedup; a given tokenizer, one
worker) and prints the wall time, the peak RSS and the bound `gptforge.data.prepare` documents
(MEMORY_BASE_MB + MEMORY_BYTES_PER_CHAR per character). There is no reference tool to compare
with here: the figure before the piecewise tokenizer/MinHash is given in bench/RESULTS.md.

    python bench/large_document_memory.py --mb 50 [--mb 200 ...] [--recipe default]
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import tempfile
import time

SCRIPT = r"""
import random, resource, sys, time
from pathlib import Path
out, mb, recipe = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = random.Random(0)
words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 12))) for _ in range(20000)]
line = " ".join(rng.choice(words) for _ in range(20000)) + " "
src = out / "one_line.txt"
with open(src, "w") as f:
    for _ in range((mb << 20) // len(line)):
        f.write(line)
from gptforge.data.tokenizer import train_bpe
train_bpe([line] * 3, 4096).save(out / "tok.json")
from gptforge.data.prepare import PrepareConfig, prepare
t = time.perf_counter()
prepare(PrepareConfig(inputs=[str(src)], out=str(out / "data"), tokenizer=str(out / "tok.json"), workers=1,
                      recipe=recipe), show_progress=False)
print(src.stat().st_size, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter() - t)
"""


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return platform.processor() or "unknown CPU"
    model = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "?")
    flags = next((ln for ln in out.splitlines() if ln.startswith("Flags")), "")
    extras = [f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f in flags.split()]
    return f"{model} ({', '.join(extras) or 'no AVX-512'})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, action="append", help="document size in MiB (repeatable; default 50)")
    ap.add_argument("--recipe", default="default")
    args = ap.parse_args()
    from gptforge.data.prepare import MEMORY_BASE_MB, MEMORY_BYTES_PER_CHAR

    print(f"CPU: {cpu_name()}; python {platform.python_version()}")
    for mb in args.mb or [50]:
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            proc = subprocess.run([sys.executable, "-c", SCRIPT, tmp, str(mb), args.recipe], capture_output=True,
                                  text=True)
            if proc.returncode:
                print(proc.stderr[-3000:])
                raise SystemExit(f"prepare failed on {mb} MB")
            size, peak_kib, seconds = proc.stdout.split()[-3:]
            bound = MEMORY_BASE_MB + MEMORY_BYTES_PER_CHAR * int(size) / 2**20
            print(f"{int(size) / 2**20:.0f} MiB one-line document, recipe {args.recipe}: prepare {float(seconds):.1f} s "
                  f"({time.perf_counter() - t:.1f} s with generation), peak RSS {int(peak_kib) / 1024:.0f} MB, "
                  f"bound {bound:.0f} MB")


if __name__ == "__main__":
    main()
