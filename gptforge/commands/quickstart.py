"""`gptforge quickstart`: the built-in default job on the Python standard library's own text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from gptforge.data.tokenizer import MAX_VOCAB_SIZE, MIN_VOCAB_SIZE
from gptforge.options import bounded, command_parser, parse_command

REFERENCE_STEPS = 1048
"""Steps the README's reference quickstart planned for 10 minutes: the default recipe (qwen3-micro +
Muon, bf16) on the 2-core AVX-512 BF16 VM, from a clean clone on 2026-12-02 (0.515 s per step
measured); 10.9 minutes of training, final val loss 3.629 against a unigram entropy of 6.640
nats/token."""

# One description: `gptforge --help` lists SUMMARY (read from this file unimported); DESCRIPTION begins with it.
SUMMARY = "Build a corpus from the Python standard library, train a small GPT on the CPU, evaluate, sample."

DESCRIPTION = SUMMARY + "\n\n" + ("Build a corpus from the Python standard library's source files (tests excluded), train a "
               "byte-level BPE tokenizer and a small GPT on the CPU for a bounded time, evaluate it on held-out "
               "files against a unigram baseline, and print samples.")


@dataclass
class QuickstartOptions:
    out: str = "quickstart"
    """Output folder for data/ and run/."""
    minutes: float = bounded(10.0, low=0, low_open=True)
    """Training time budget in minutes; steps are set from a measured step time."""
    preset: str = "qwen3-micro"
    """Model preset (qwen3-micro: 4 layers, d_model 128, Qwen3 blocks, exports exactly to hf, gguf and
    onnx; gpt2-micro: the same shape with GPT-2 blocks; modern-micro: opt-in, NOT exportable (logit soft
    cap, relu2), it stays in gptforge's format)."""
    optimizer: str = "muon"
    """train.optimizer: muon (Muon on the hidden matrices, AdamW on the rest) or adamw."""
    vocab_size: int = bounded(4096, low=MIN_VOCAB_SIZE, high=MAX_VOCAB_SIZE)
    """BPE vocabulary size, including the 256 byte tokens and <|endoftext|> (a small --max-files corpus
    may stop short of it)."""
    micro_batch_size: int = bounded(16, low=1)
    """Sequences per step."""
    block_size: int = bounded(256, low=1)
    """Context length in tokens."""
    max_files: Optional[int] = bounded(None, low=1)
    """Use only N library files (quick trials)."""
    steps: Optional[int] = bounded(None, low=1)
    """Train exactly this many optimizer steps instead of filling --minutes."""
    workers: int = bounded(0, low=0)
    """Tokenizer worker processes (0: all cores)."""
    quiet: bool = False
    """No progress bars."""


def build_parser():
    return command_parser("gptforge quickstart", DESCRIPTION, QuickstartOptions)


def main(argv: list[str]) -> int:
    args, _ = parse_command(build_parser(), argv)
    from pathlib import Path

    from rich.console import Console

    from gptforge.quickstart import run_quickstart

    console = Console()
    r = run_quickstart(Path(args.out), minutes=args.minutes, vocab_size=args.vocab_size, preset=args.preset,
                       optimizer=args.optimizer,
                       micro_batch_size=args.micro_batch_size, block_size=args.block_size,
                       max_files=args.max_files, workers=args.workers, steps=args.steps, progress=not args.quiet,
                       log=lambda m: console.print(m, highlight=False, markup=False))
    verdict = "well below" if r.val_loss < r.unigram_entropy - 0.5 else "NOT well below"
    console.print(f"\nfinal val loss {r.val_loss:.3f} is {verdict} the unigram entropy {r.unigram_entropy:.3f} "
                  f"nats/token ({r.steps} steps, {r.train_seconds / 60:.1f} min of training)", highlight=False)
    if r.steps < REFERENCE_STEPS // 2 and args.steps is None:
        console.print(f"only {r.steps} steps fit in --minutes {args.minutes:g} on this machine (the README's "
                      f"reference run of the default recipe on a 2-core VM planned {REFERENCE_STEPS:,} for 10 minutes and "
                      "ended at val loss 3.63): expect "
                      "a higher loss and rougher samples; rerun with a larger --minutes or --steps "
                      f"{REFERENCE_STEPS}", highlight=False)
    return 0
