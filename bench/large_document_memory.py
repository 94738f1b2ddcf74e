"""Peak memory and speed of `prepare` on one huge single-line document (issue 15 item 16).

Generates an N MB one-line .txt (one document: no newline, no --doc-separator), runs `prepare`
on it in a fresh process (recipe default: clean, PII, exact + near dedup; a given tokenizer;
--workers processes, 1 by default) and prints the wall time, the throughput (input MB/s and
tokens/s over the whole prepare; CPU seconds of the processes), how many tasks and processes tokenized it (a big shard is cut
into byte windows, `gptforge.data.windows`), and the peak RSS of the prepare process itself and
of its largest worker (getrusage for the prepare process; /proc VmHWM for its children, the
maximum over them, since a spawn worker's ru_maxrss starts at its parent's peak) and the peak of
all processes' summed VmRSS (sampled; with one worker every phase runs in the prepare process;
a single-shard phase does too), beside the bound
`gptforge.data.prepare` documents (MEMORY_BASE_MB + MEMORY_BYTES_PER_CHAR per character). There
is no reference tool to compare with here: the figure before the piecewise tokenizer/MinHash is
given in bench/RESULTS.md.

    python bench/large_document_memory.py --mb 50 [--mb 500 ...] [--workers 2] [--window-mb 32 (0: none)]
        [--recipe default] [--dir FOLDER]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

from machine import cpu_description  # bench/machine.py

SCRIPT = r"""
import json, random, resource, sys, time
from pathlib import Path
out, mb, recipe, workers, window_mb = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
rng = random.Random(0)
words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 12))) for _ in range(20000)]
line = " ".join(rng.choice(words) for _ in range(20000)) + " "
src = out / "one_line.txt"
with open(src, "w") as f:
    for _ in range((mb << 20) // len(line)):
        f.write(line)
from gptforge.data.tokenizer import train_bpe
train_bpe([line] * 3, 4096).save(out / "tok.json")
from gptforge.data import prepare as P
from gptforge.data.prepare import PrepareConfig, prepare
P.ENCODE_WINDOW_BYTES = (window_mb << 20) if window_mb else 1 << 62  # 0: one tokenize task per shard
t = time.perf_counter()
res = prepare(PrepareConfig(inputs=[str(src)], out=str(out / "data"), tokenizer=str(out / "tok.json"),
                            workers=workers, recipe=recipe), show_progress=False)
seconds = time.perf_counter() - t
tok = res.report["throughput"].get("tokenize", {})
print(json.dumps({"bytes": src.stat().st_size, "seconds": seconds,
                  "tokens": sum(s["tokens"] for s in res.meta["splits"].values()),
                  "self_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "cpu_seconds": sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF,
                                     resource.RUSAGE_CHILDREN) for f in ("ru_utime", "ru_stime")),
                  "timings": {k: v["seconds"] for k, v in res.report["throughput"].items()}, "tokenize_tasks": tok.get("tasks"),
                  "tokenize_processes": tok.get("processes")}))
"""


class TreeMemory:
    """Polls /proc every `interval` s for a process and its descendants (Linux): the peak VmHWM of
    each process (its own high-water mark: unlike getrusage's ru_maxrss, not inherited from the
    parent a spawn worker was forked from) and the peak of the tree's summed VmRSS."""

    def __init__(self, pid: int, interval: float = 0.5):
        import threading

        self.pid, self.interval = pid, interval
        self.hwm_kib: dict[int, int] = {}
        self.sum_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(entry))
        out, todo = [], [self.pid]
        while todo:
            p = todo.pop()
            out.append(p)
            todo.extend(children.get(p, []))
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for p in self._tree():
                try:
                    with open(f"/proc/{p}/status") as f:
                        fields = dict(ln.split(":", 1) for ln in f if ":" in ln)
                    rss, hwm = int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])
                except (OSError, KeyError, ValueError):
                    continue
                total += rss
                self.hwm_kib[p] = max(self.hwm_kib.get(p, 0), hwm)
            self.sum_kib = max(self.sum_kib, total)
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, action="append", help="document size in MiB (repeatable; default 50)")
    ap.add_argument("--recipe", default="default")
    ap.add_argument("--workers", type=int, default=1, help="prepare --workers (default 1)")
    ap.add_argument("--window-mb", type=int, default=32,
                    help="tokenize windows of this many MiB (prepare.ENCODE_WINDOW_BYTES; 0: none, one task per shard)")
    ap.add_argument("--dir", default=None, help="folder for the generated file and output (default: a temp folder)")
    args = ap.parse_args()
    from gptforge.data.prepare import MEMORY_BASE_MB, MEMORY_BYTES_PER_CHAR

    print(f"CPU: {cpu_description()}; python {platform.python_version()}")
    for mb in args.mb or [50]:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            t = time.perf_counter()
            proc = subprocess.Popen([sys.executable, "-c", SCRIPT, tmp, str(mb), args.recipe, str(args.workers),
                                     str(args.window_mb)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            mem = TreeMemory(proc.pid)
            stdout, stderr = proc.communicate()
            mem.stop()
            if proc.returncode:
                print(stderr[-3000:])
                raise SystemExit(f"prepare failed on {mb} MB")
            r = json.loads(stdout.strip().splitlines()[-1])
            workers = [v for p, v in mem.hwm_kib.items() if p != proc.pid]
            size_mb = r["bytes"] / 2**20
            bound = MEMORY_BASE_MB + MEMORY_BYTES_PER_CHAR * size_mb
            phases = ", ".join(f"{k} {v:.0f} s" for k, v in r["timings"].items())
            print(f"{size_mb:.0f} MiB one-line document, recipe {args.recipe}, --workers {args.workers}, "
                  f"--window-mb {args.window_mb}: "
                  f"prepare {r['seconds']:.1f} s ({time.perf_counter() - t:.1f} s with generation; {phases}), "
                  f"{size_mb / r['seconds']:.2f} MB/s, {r['tokens'] / r['seconds']:,.0f} tokens/s, "
                  f"{r['cpu_seconds']:.0f} CPU s (prepare process and workers, generation included); "
                  f"tokenized in {r['tokenize_tasks']} tasks by {r['tokenize_processes']} process(es); "
                  f"peak RSS: prepare process {r['self_kib'] / 1024:.0f} MB (getrusage), largest of "
                  f"{len(workers)} child processes {max(workers, default=0) / 1024:.0f} MB (max of their VmHWM, "
                  f"not a sum), all processes together {mem.sum_kib / 1024:.0f} MB (peak of the summed VmRSS, "
                  f"sampled every {mem.interval} s); bound {bound:.0f} MB per process")


if __name__ == "__main__":
    main()
