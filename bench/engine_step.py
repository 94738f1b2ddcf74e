"""The engine's compiled static-shape decode step (issue 45, item 5) against `generate` and
`generate --compile`, in one run.

    python bench/engine_step.py [--preset llama-micro] [--new-tokens 128] [--prompt-tokens 32]
        [--rounds 3] [--threads 1] [--write]

One greedy stream of exactly --new-tokens tokens after the same random prompt (random weights,
vocabulary 1000, fp32, --threads threads), timed whole (prefill included) for: `generate` eager,
`generate(compile=True)`, the continuous-batching `Engine` eager and with `compile_decode=True`
(what `gptforge serve --compile` runs), and the two engines at 8 streams (aggregate tokens/s).
Each compiled variant's first (compiling) call comes before the rounds; then best of --rounds
rounds, each round running every variant once in turn, so a change of the machine's load hits all
of them alike. Prefix reuse is off (every round prefills its prompt, as `generate` does).
Prints a Markdown table; --write appends it to bench/RESULTS.md with the command line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from machine import cpu_description  # bench/machine.py

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def engine_run(engine, prompts, n: int) -> None:
    """Submit every prompt (greedy, n tokens) and step `engine` until all are done."""
    from gptforge.infer.engine import SamplingParams

    for p in prompts:
        engine.submit(p, SamplingParams(max_tokens=n, temperature=0), lambda ev: None)
    while engine.step():
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama-micro")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--write", action="store_true", help="append the table to bench/RESULTS.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from gptforge.config import ModelConfig
    from gptforge.infer.engine import Engine
    from gptforge.infer.generate import generate
    from gptforge.model.gpt import GPT

    load0 = os.getloadavg()
    torch.manual_seed(0)
    model = GPT(ModelConfig(preset=args.preset, vocab_size=1000).resolved()).eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 1000, (args.prompt_tokens,), generator=g).tolist() for _ in range(8)]
    n, idx = args.new_tokens, torch.tensor([prompts[0]])
    engines = {c: Engine(model, lambda ids: "", max_batch_size=8, prefix_caching=False, compile_decode=c) for c in (False, True)}
    runs = {
        "generate": (1, lambda: generate(model, idx, n, temperature=0)),
        "generate --compile": (1, lambda: generate(model, idx, n, temperature=0, compile=True)),
        "engine": (1, lambda: engine_run(engines[False], prompts[:1], n)),
        "engine compiled": (1, lambda: engine_run(engines[True], prompts[:1], n)),
        "engine, 8 streams": (8, lambda: engine_run(engines[False], prompts, n)),
        "engine compiled, 8 streams": (8, lambda: engine_run(engines[True], prompts, n)),
    }
    best = dict.fromkeys(runs, float("inf"))
    with torch.no_grad():
        t = time.perf_counter()
        for name in ("generate --compile", "engine compiled", "engine compiled, 8 streams"):
            runs[name][1]()  # compiles (every bucket the run reaches)
        compile_s = time.perf_counter() - t
        for _ in range(args.rounds):
            for name, (_streams, fn) in runs.items():
                t = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t)
    rate = {name: runs[name][0] * n / best[name] for name in runs}
    for name, r in rate.items():
        print(f"{name}: {r:.0f} tok/s", flush=True)
    load1 = os.getloadavg()
    rows = ["| variant | streams | tok/s | vs generate --compile |", "|---|---:|---:|---:|"]
    for name, (streams, _fn) in runs.items():
        rows.append(f"| {name} | {streams} | {rate[name]:.0f} | {rate[name] / rate['generate --compile']:.2f}x |")
    text = (f"Machine: {cpu_description()}, torch {torch.__version__}, {args.threads} thread(s); load average "
            f"{load0[0]:.1f} / {load0[1]:.1f} / {load0[2]:.1f} at start, {load1[0]:.1f} at end. {args.preset} "
            f"(random weights, vocabulary 1000), fp32, prompt {args.prompt_tokens} tokens, {n} new tokens, greedy, "
            f"best of {args.rounds} rounds; compiling calls before the rounds took {compile_s:.0f} s.\n\n"
            + "\n".join(rows) + "\n")
    print("\n" + text)
    if args.write:
        cmd = "python bench/engine_step.py " + " ".join(sys.argv[1:])
        with open(REPO / "bench" / "RESULTS.md", "a") as f:
            f.write(f"\n## The engine's compiled decode step against generate --compile (issue 45)\n\n"
                    f"Command: `{cmd.strip()}`. {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
