"""`gptforge sweep --data D --out SWEEP_DIR --budget-minutes M`: the small runs a scaling-law fit needs.

Plans a grid of model sizes x token counts that fits the time budget on this machine (from a
measured step time), trains each as an ordinary run directory under SWEEP_DIR with the normal
trainer, and records the final val loss over every val token. Run the same command again to
continue a killed sweep. Then: `gptforge plan --fit SWEEP_DIR ...`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

# One description: `gptforge --help` lists SUMMARY (read from this file unimported); DESCRIPTION begins with it.
SUMMARY = "Plan and run a scaling sweep of small runs within a time budget (resumable), for `plan --fit`."

DESCRIPTION = SUMMARY + """

Plan and run a scaling sweep (model sizes x token counts) within a time budget on this
machine; each run is an ordinary run directory; the same command continues a killed sweep. Fit it
with `gptforge plan --fit SWEEP_DIR`."""


@dataclass
class SweepOptions:
    data: str
    """Token shard folder (the --out of `gptforge prepare`), with a val split."""
    out: str
    """Sweep directory: sweep.json (the plan) and one run directory per run."""
    budget_minutes: float
    """Wall-clock budget of the whole sweep on this machine, in minutes."""
    sizes: list[str] = field(default_factory=lambda: ["2x32", "2x64", "4x64", "4x128"])
    """Model sizes as LAYERSxD_MODEL (GPT-2 blocks, head width 16)."""
    tokens: Optional[list[str]] = None
    """Training token counts (e.g. 200k 400k); default: 1x, 2x, 4x a base count that fills the budget."""
    block_size: int = 64
    """Sequence length of every run."""
    micro_batch_size: int = 16
    """Sequences per step of every run."""
    lr: float = 2e-3
    """Peak learning rate of every run (cosine to lr/10 over each run)."""
    seed: int = 1337
    """Seed of every run."""
    device: str = "auto"
    """Device: auto, cpu, cuda, cuda:N, mps."""
    plan_only: bool = False
    """Print the plan (and write sweep.json) without training."""


def main(argv: list[str]) -> int:
    from gptforge.errors import InputError
    from gptforge.options import command_parser, parse_command
    from gptforge.plan.flops import parse_tokens
    from gptforge.train.workflows.sweep import load_or_write_plan, plan_sweep, run_sweep

    opts, _ = parse_command(command_parser("gptforge sweep", DESCRIPTION, SweepOptions), argv)
    if opts.budget_minutes <= 0:
        raise InputError("--budget-minutes must be > 0")
    try:
        tokens = None if opts.tokens is None else [parse_tokens(t) for t in opts.tokens]
    except ValueError as e:
        raise InputError(str(e)) from e
    out = Path(opts.out)
    kwargs = dict(budget_seconds=opts.budget_minutes * 60, sizes=opts.sizes, tokens=tokens,
                  block_size=opts.block_size, micro_batch_size=opts.micro_batch_size, lr=opts.lr, seed=opts.seed,
                  device=opts.device)
    options = {"sizes": opts.sizes, "tokens": None if tokens is None else [int(t) for t in tokens],
               "block_size": opts.block_size, "micro_batch_size": opts.micro_batch_size, "lr": opts.lr,
               "seed": opts.seed, "device": opts.device, "budget_seconds": opts.budget_minutes * 60}
    plan, resumed = load_or_write_plan(out, lambda: plan_sweep(opts.data, log=print, **kwargs), options)
    print(("continuing" if resumed else "planned") + f" sweep in {out}: {len(plan.runs)} runs, estimated "
          f"{plan.est_seconds / 60:.1f} of {plan.budget_seconds / 60:g} minutes; val split {plan.val_tokens:,} tokens")
    for r in plan.runs:
        print(f"  {r.name:<24} {r.max_steps:>6} steps {r.tokens:>12,} tokens  ~{r.est_seconds:.0f} s")
    if plan.dropped:
        print("  left out to fit the budget: " + ", ".join(plan.dropped))
    if opts.plan_only:
        return 0
    done = run_sweep(plan, opts.data, out, log=print)
    if done["stopped"]:
        print(f"stopped in {done['stopped']}: run the same command to continue")
        return 130
    print(f"sweep done: {len(done['finished'])} runs in {out} ({done['seconds'] / 60:.1f} min this call); "
          f"fit it: gptforge plan --fit {out} --model LAYERSxD_MODEL --tokens T")
    return 0
