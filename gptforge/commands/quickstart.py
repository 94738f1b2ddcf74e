"""`gptforge quickstart`: the built-in default job on the Python standard library's own text."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gptforge quickstart",
        description="Build a corpus from the Python standard library's source files (tests excluded), "
                    "train a byte-level BPE tokenizer and a small GPT on the CPU for a bounded time, "
                    "evaluate it on held-out files against a unigram baseline, and print samples.")
    p.add_argument("--out", default="quickstart", help="Output folder for data/ and run/ (default ./quickstart).")
    p.add_argument("--minutes", type=float, default=10.0,
                   help="Training time budget in minutes; steps are set from a measured step time (default 10).")
    p.add_argument("--preset", default="gpt2-micro", help="Model preset (default gpt2-micro: 4 layers, d_model 128).")
    p.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary size (default 4096).")
    p.add_argument("--micro-batch-size", type=int, default=16, help="Sequences per step (default 16).")
    p.add_argument("--block-size", type=int, default=256, help="Context length in tokens (default 256).")
    p.add_argument("--max-files", type=int, default=None, help="Use only N library files (quick trials).")
    p.add_argument("--workers", type=int, default=0, help="Tokenizer worker processes (default: all cores).")
    p.add_argument("--quiet", action="store_true", help="No progress bars.")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from pathlib import Path

    from rich.console import Console

    from gptforge.quickstart import run_quickstart

    console = Console()
    try:
        r = run_quickstart(Path(args.out), minutes=args.minutes, vocab_size=args.vocab_size, preset=args.preset,
                           micro_batch_size=args.micro_batch_size, block_size=args.block_size,
                           max_files=args.max_files, workers=args.workers, progress=not args.quiet,
                           log=lambda m: console.print(m, highlight=False, markup=False))
    except (FileNotFoundError, ValueError) as e:
        print(f"gptforge quickstart: error: {e}", file=sys.stderr)
        return 1
    verdict = "well below" if r.val_loss < r.unigram_entropy - 0.5 else "NOT well below"
    console.print(f"\nfinal val loss {r.val_loss:.3f} is {verdict} the unigram entropy {r.unigram_entropy:.3f} "
                  f"nats/token ({r.steps} steps, {r.train_seconds / 60:.1f} min of training)", highlight=False)
    return 0
