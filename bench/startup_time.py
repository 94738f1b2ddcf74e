"""Start-up time of `gptforge generate` and `gptforge evaluate` against `python -c 'import torch'`.

A short command's time is mostly start-up: this measures the wall time of each command on a tiny
run (trained here, 2 steps), median of --repeats, and prints how much each takes beyond importing
torch (target: within about 1.5 s).

    python bench/startup_time.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def wall(cmd: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = Path(os.__file__).parent
        files = sorted(src.glob("*.py"))[:30]
        subprocess.run([py, "-m", "gptforge.cli", "prepare", *map(str, files), "--out", str(tmp / "d"),
                        "--vocab-size", "400", "--no-progress", "--workers", "1"], check=True, capture_output=True)
        subprocess.run([py, "-m", "gptforge.cli", "pretrain", "--data", str(tmp / "d"), "--out", str(tmp / "r"),
                        "--model.preset", "gpt2-nano", "--model.block_size", "32", "--train.max_steps", "2",
                        "--train.micro_batch_size", "2", "--train.eval_interval", "0", "--train.report", "false",
                        "--quiet"], check=True, capture_output=True)
        text = tmp / "t.txt"
        text.write_text(files[0].read_text()[:4000])
        base = wall([py, "-c", "import torch"], args.repeats)
        rows = [("python -c 'import torch'", base)]
        rows.append(("gptforge --help", wall([py, "-m", "gptforge.cli", "--help"], args.repeats)))
        rows.append(("gptforge generate RUN --max-new-tokens 1",
                     wall([py, "-m", "gptforge.cli", "generate", str(tmp / "r"), "--max-new-tokens", "1"], args.repeats)))
        rows.append(("gptforge evaluate RUN --text FILE",
                     wall([py, "-m", "gptforge.cli", "evaluate", str(tmp / "r"), "--text", str(text)], args.repeats)))
    print(f"median of {args.repeats} runs, load average {os.getloadavg()[0]:.1f}")
    for name, t in rows:
        extra = "" if name.startswith("python") else f"   (+{t - base:.2f} s over import torch)"
        print(f"  {name:<45} {t:5.2f} s{extra}")


if __name__ == "__main__":
    main()
