"""Single-stream greedy decode, eager against `generate(compile=True)` (the static-shape decode
step), in one process with the two variants alternating run by run, plus a per-token profile.

    python bench/decode_ab.py [--presets llama-micro gpt2-mini] [--dtypes fp32,bf16]
        [--new-tokens 64] [--rounds 7] [--profile]

Random weights (vocabulary 1000, GPT-2 shapes with the tanh GELU, as bench/serve_throughput.py),
a 32-token prompt, one thread. Prints, per preset and dtype, the median tokens/s of each variant
over --rounds alternating runs (after a first, compiling call), their ratio and whether the two
gave the same greedy tokens; with --profile,
where one eager token's time goes: the ATen operators' self time (top 6) and the rest of the wall
time (Python, the module calls, the generation loop).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from machine import cpu_description  # bench/machine.py

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build(preset: str, dtype: torch.dtype):
    from gptforge.config import ModelConfig
    from gptforge.model.gpt import GPT

    torch.manual_seed(0)
    extra = {"activation": "gelu_tanh"} if preset.startswith("gpt2") else {}
    return GPT(ModelConfig(preset=preset, vocab_size=1000, **extra).resolved()).eval().to(dtype)


def ab(model, idx, n: int, rounds: int) -> tuple[float, float, float, bool]:
    """(eager tok/s, compiled tok/s, compile seconds, same greedy tokens): medians over
    alternating runs."""
    from gptforge.infer.generate import generate

    t = time.perf_counter()
    same = torch.equal(generate(model, idx, n, temperature=0, compile=True), generate(model, idx, n, temperature=0))
    first = time.perf_counter() - t
    eager, comp = [], []
    for _ in range(rounds):
        for out, c in ((eager, False), (comp, True)):
            t = time.perf_counter()
            generate(model, idx, n, temperature=0, compile=c)
            out.append(n / (time.perf_counter() - t))
    return statistics.median(eager), statistics.median(comp), first, same


def profile(model, idx, n: int) -> str:
    """One eager generation under torch.profiler: ms per token, the top ATen self times, the rest."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    from gptforge.infer.generate import generate

    with prof(activities=[ProfilerActivity.CPU]) as p:
        t = time.perf_counter()
        generate(model, idx, n, temperature=0)
        wall = (time.perf_counter() - t) * 1e3 / n
    rows = sorted(p.key_averages(), key=lambda e: -e.self_cpu_time_total)
    aten = sum(e.self_cpu_time_total for e in rows) / 1e3 / n
    top = ", ".join(f"{e.key.removeprefix('aten::')} {e.self_cpu_time_total / 1e3 / n:.3f}" for e in rows[:6])
    return f"{wall:.2f} ms/token under the profiler: ATen ops {aten:.2f} ({top}), other {wall - aten:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["llama-micro", "gpt2-mini"])
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"Machine: {cpu_description()}, torch {torch.__version__}, 1 thread; load {os.getloadavg()[0]:.1f}")
    print("| model | dtype | eager | compiled (static step) | compiled / eager | first call (compiles) | "
          "same greedy tokens | load |")
    print("|---|---|---:|---:|---:|---:|---|---:|")
    notes = []
    for preset in args.presets:
        for d in args.dtypes.split(","):
            model = build(preset, DTYPES[d])
            idx = torch.randint(1, 1000, (1, 32), generator=torch.Generator().manual_seed(1))
            with torch.no_grad():
                e, c, first, same = ab(model, idx, args.new_tokens, args.rounds)
                if args.profile:
                    notes.append(f"{preset} {d} eager: {profile(model, idx, args.new_tokens)}")
            print(f"| {preset} | {d} | {e:.0f} tok/s | {c:.0f} tok/s | {c / e:.2f}x | {first:.0f} s | "
                  f"{'yes' if same else 'no (random weights: near-ties under rounding)'} | {os.getloadavg()[0]:.1f} |", flush=True)
    for n in notes:
        print("- " + n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
