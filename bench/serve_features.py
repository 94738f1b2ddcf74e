"""Prefix reuse and n-gram speculation in the serving engine, in one run (issue 45).

    python bench/serve_features.py [--rounds 3] [--new-tokens 96] [--threads 1] [--write]

1. Prefix reuse: time to first token (in process, `Engine.step` until the first event) of a
   1,000-token prompt on a random-weight llama-micro with a 1,024-token context, so that prefill
   dominates: the first request (nothing cached) against a second one that shares its first 960
   tokens (target: at most 1/3 of the first), best of --rounds rounds (the cache is cleared before
   each first request).
2. n-gram speculation (`speculative="ngram"`, 4 draft tokens) against plain decoding, one stream,
   tokens/s of --new-tokens tokens, on llama-micro (256-token context) trained here for a minute
   on ~40 standard-library files: a repetitive workload (greedy; the prompt is a code file's start
   followed by its first lines again, so continuing rewrites the file) and free text (sampled at
   temperature 1 with a seed, from an English prompt). Rounds alternate plain and speculative runs;
   best of --rounds. Acceptance = accepted / verified draft tokens.
Prints the machine, its load (os.getloadavg) and Markdown tables; --write appends them to
bench/RESULTS.md with the command line.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from machine import cpu_description  # bench/machine.py

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FREE_TEXT = ("The history of the city begins with a small market on the river, where traders from the north "
             "met farmers from the valley. Over the years the market grew into")


def load() -> str:
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def run_one(engine, prompt, params) -> tuple[float, float, int]:
    """(seconds to the first event, total seconds, tokens) of one request stepped alone."""
    from gptforge.infer.engine import Event

    events: list[Event] = []
    t0 = time.perf_counter()
    engine.submit(prompt, params, events.append)
    first = None
    while not (events and events[-1].finish_reason):
        engine.step()
        if first is None and events:
            first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    assert first is not None
    return first, total, sum(e.token_id is not None for e in events)


def prefix_ttft(rounds: int) -> list[str]:
    from gptforge.config import ModelConfig
    from gptforge.infer.engine import Engine, SamplingParams
    from gptforge.model.gpt import GPT

    torch.manual_seed(0)
    model = GPT(ModelConfig(preset="llama-micro", vocab_size=1000, block_size=1024).resolved()).eval()
    g = torch.Generator().manual_seed(0)
    shared = torch.randint(0, 1000, (960,), generator=g).tolist()
    first_p = shared + torch.randint(0, 1000, (40,), generator=g).tolist()
    second_p = shared + torch.randint(0, 1000, (40,), generator=g).tolist()
    eng = Engine(model, lambda ids: "", max_batch_size=2)
    params = SamplingParams(max_tokens=1, temperature=0)
    with torch.no_grad():
        run_one(eng, first_p, params)  # warm-up (allocations, first-call paths)
        best = [float("inf"), float("inf")]
        for _ in range(rounds):
            eng.prefix.clear()
            best[0] = min(best[0], run_one(eng, first_p, params)[0])
            t = run_one(eng, second_p, params)[0]
            best[1] = min(best[1], t)
    cached = eng.stats.prefix_hit_tokens
    return ["### Prefix reuse: time to first token (issue 45)", "",
            f"llama-micro (random weights, 1,024-token context), fp32, {torch.get_num_threads()} thread(s), in process; "
            f"{load()}", "",
            "| request | prompt tokens | cached tokens | time to first token (ms) | vs first |",
            "|---|---|---|---|---|",
            f"| first (nothing cached) | {len(first_p)} | 0 | {best[0] * 1e3:.1f} | 1.00x |",
            f"| second (shares 960 tokens) | {len(second_p)} | 960 | {best[1] * 1e3:.1f} | "
            f"{best[1] / best[0]:.2f}x (target <= 0.33x) |", "",
            f"(prefix hit tokens over the run: {cached:,}; best of {rounds} rounds)", ""]


def trained_micro(root: Path):
    """(model, Tokenizer) of llama-micro (256-token context) trained briefly on standard-library files."""
    from gptforge.config import ModelConfig, RunConfig, TrainConfig
    from gptforge.data.prepare import PrepareConfig, prepare
    from gptforge.data.tokenizer import Tokenizer
    from gptforge.runtime.loading import load_for_inference
    from gptforge.train.run import train as run_training

    files = sorted(Path(os.__file__).parent.glob("*.py"))[:40]
    prepare(PrepareConfig(inputs=[str(p) for p in files], out=str(root / "data"), vocab_size=512, val_fraction=0.1,
                          workers=1), show_progress=False)
    cfg = RunConfig(model=ModelConfig(preset="llama-micro", block_size=256),
                    train=TrainConfig(max_steps=150, micro_batch_size=8, lr=3e-3, warmup_steps=10, eval_interval=0,
                                      tensorboard=False))
    run_training(cfg, root / "data", root / "run", progress=False)
    model, _ckpt, _doc, tok = load_for_inference(root / "run", "cpu")
    return model.eval(), Tokenizer.from_file(tok)


def speculation(rounds: int, new_tokens: int) -> list[str]:
    from gptforge.infer.engine import Engine, SamplingParams

    with tempfile.TemporaryDirectory() as d:
        model, tok = trained_micro(Path(d))
    code = Path(os.__file__).parent.joinpath("bisect.py").read_text()
    ids = tok.encode(code)
    room = 256 - new_tokens
    repetitive = ids[:room - 40] + ids[:40]
    free = tok.encode(FREE_TEXT)[-room:]
    work = {"repetitive (code rewrite, greedy)": (repetitive, SamplingParams(max_tokens=new_tokens, temperature=0)),
            "free text (temperature 1, seed 0)": (free, SamplingParams(max_tokens=new_tokens, temperature=1.0, seed=0))}
    rows = []
    with torch.no_grad():
        for name, (prompt, params) in work.items():
            engines = {"plain": Engine(model, tok.decode, max_batch_size=1, prefix_caching=False),
                       "ngram": Engine(model, tok.decode, max_batch_size=1, prefix_caching=False, speculative="ngram",
                                       num_speculative_tokens=4)}
            best = dict.fromkeys(engines, 0.0)
            for e in engines.values():
                run_one(e, prompt, params)  # warm-up
            for _ in range(rounds):
                for k, e in engines.items():
                    _f, total, n = run_one(e, prompt, params)
                    best[k] = max(best[k], n / total)
            st = engines["ngram"].stats
            acc = st.spec_accepted_tokens / st.spec_draft_tokens if st.spec_draft_tokens else 0.0
            rows.append(f"| {name} | {best['plain']:,.0f} | {best['ngram']:,.0f} | {best['ngram'] / best['plain']:.2f}x "
                        f"| {acc:.0%} ({st.spec_accepted_tokens:,} / {st.spec_draft_tokens:,}) |")
    return ["### n-gram speculation: one stream, tokens/s (issue 45)", "",
            f"llama-micro trained 150 steps on 40 standard-library files (256-token context), fp32, "
            f"{torch.get_num_threads()} thread(s), in process, {new_tokens} new tokens, 4 draft tokens; {load()}", "",
            "| workload | plain tok/s | ngram tok/s | ratio | drafts accepted |", "|---|---|---|---|---|", *rows,
            "", f"(targets: repetitive >= 1.3x, free text >= 0.95x; best of {rounds} alternating rounds)", ""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = [f"## bench/serve_features.py ({time.strftime('%Y-%m-%d')})", "", f"`{' '.join(sys.argv)}`", "",
           f"Machine: {cpu_description()}; {load()} at start", ""]
    out += prefix_ttft(args.rounds)
    print("\n".join(out), flush=True)
    spec = speculation(args.rounds, args.new_tokens)
    print("\n".join(spec), flush=True)
    if args.write:
        with open(REPO / "bench" / "RESULTS.md", "a") as f:
            f.write("\n" + "\n".join(out + spec) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
