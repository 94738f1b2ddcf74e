"""Predict a run's val loss from a sweep of smaller runs, then train it and compare.

    python bench/predict.py --data SHARDS [--budget-minutes 4] [--out WORKDIR] [--write]

1. `gptforge.train.workflows.sweep`: a sweep of sizes 2x32, 2x64, 4x64 (LAYERSxD_MODEL) x a 1/2/4 token
   ladder within the budget on this machine.
2. `gptforge.plan.fit`: fit L(N, D) and predict the val loss of 8x64 (2x the non-embedding
   parameters of 4x64) trained on 2x the tokens of the longest sweep run (4x its compute).
3. Train that model with the sweep's recipe and score every val token; print predicted vs
   measured, and whether the measurement lies in the 90% bootstrap interval.

SHARDS: a `gptforge prepare` folder, e.g. from
`gptforge prepare CORPUS --out SHARDS --vocab-size 1024 --val-fraction 0.02` (bench/RESULTS.md used
the shared openshakespeare corpus).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_description  # bench/machine.py

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))




def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="token shard folder (gptforge prepare --out)")
    ap.add_argument("--budget-minutes", type=float, default=4.0, help="sweep budget")
    ap.add_argument("--out", default=None, help="work folder (default: a temporary one)")
    ap.add_argument("--sizes", nargs="+", default=["2x32", "2x64", "4x64"])
    ap.add_argument("--big", default="8x64", help="the model to predict and train")
    ap.add_argument("--write", action="store_true", help="append the figures to bench/RESULTS.md")
    args = ap.parse_args()

    import torch

    from gptforge.config import ParallelConfig, RunConfig
    from gptforge.plan.fit import find_runs, fit_scaling_law, non_embedding_params, plot_fit
    from gptforge.runtime.device import pick_device
    from gptforge.train.run import train
    from gptforge.train.workflows.sweep import (
        evaluate_val_split,
        load_or_write_plan,
        model_config,
        parse_size,
        plan_sweep,
        run_sweep,
        train_config,
    )

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    work = Path(args.out or tempfile.mkdtemp(prefix="predict_"))
    sweep_dir = work / "sweep"
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    kw = dict(budget_seconds=args.budget_minutes * 60, sizes=args.sizes, block_size=64, micro_batch_size=16,
              lr=2e-3, seed=1337, device="cpu")
    opts = {**{k: v for k, v in kw.items() if k != "sizes"}, "sizes": args.sizes, "tokens": None}
    plan, _ = load_or_write_plan(sweep_dir, lambda: plan_sweep(args.data, log=print, **kw), opts)
    print(f"sweep: {len(plan.runs)} runs, estimated {plan.est_seconds / 60:.1f} min")
    run_sweep(plan, args.data, sweep_dir, log=print)
    sweep_s = time.perf_counter() - t0

    fit = fit_scaling_law(find_runs([sweep_dir]), bootstrap=200)
    s = fit.seen()
    n_layer, d_model = parse_size(args.big)
    import json

    vocab = json.loads((Path(args.data) / "meta.json").read_text())["vocab_size"]
    mc = model_config(n_layer, d_model, 64, vocab)
    n_big = non_embedding_params(mc)
    d_big = 2 * s["d_max"]
    q = fit.loss(n_big, d_big)
    print(f"fit {fit.params}; N {s['n_min']:.3g}-{s['n_max']:.3g}, D {s['d_min']:.3g}-{s['d_max']:.3g}")
    print(f"predicted val loss of {args.big} (N={n_big}, {n_big / s['n_max']:.2f}x) on {d_big:.0f} tokens "
          f"({q['flops'] / s['c_max']:.2f}x the compute): {q['loss']:.4f} [{q['loss_low']:.4f} - {q['loss_high']:.4f}]"
          + "".join(f"\n  WARNING {w}" for w in q["warnings"]))
    plot = plot_fit(fit, work / "scaling_fit.png", q)

    steps = int(d_big // (16 * 64))
    t1 = time.perf_counter()
    big_dir = work / f"big_{args.big}"
    resume = (big_dir / "checkpoints" / "latest").is_file()
    train(RunConfig(model=mc, train=train_config(steps, plan.options), parallel=ParallelConfig()), args.data,
          big_dir, resume=resume, progress=False)
    ev = evaluate_val_split(big_dir, Path(args.data), pick_device("cpu"))
    big_s = time.perf_counter() - t1
    measured = ev["val_loss"]
    err = q["loss"] / measured - 1
    inside = q["loss_low"] <= measured <= q["loss_high"]
    load1 = os.getloadavg()[0]
    print(f"measured val loss {measured:.4f} over {ev['val_tokens']:,} tokens; predicted/measured - 1 = {err:+.2%}; "
          f"inside the interval: {inside}; sweep {sweep_s / 60:.1f} min, big run {big_s / 60:.1f} min; plot {plot}")
    if args.write:
        p = fit.params
        text = (
            "\n## Scaling-law prediction (issue 17: plan --fit)\n\n"
            f"Command: `python bench/predict.py --data SHARDS --budget-minutes {args.budget_minutes:g} "
            f"--sizes {' '.join(args.sizes)} --write`, "
            "SHARDS = `gptforge prepare openshakespeare --vocab-size 1024 --val-fraction 0.02` (the shared "
            f"Shakespeare + Milton corpus, {vocab} tokens vocabulary, {ev['val_tokens']:,} val tokens). "
            f"Machine: {cpu_description()}, torch {torch.__version__} ({torch.get_num_threads()} thread); shared and "
            f"heavily loaded by other jobs (load average {load0:.0f} at the start, {load1:.0f} at the end, 2 cores).\n\n"
            f"Sweep: {len(fit.runs)} runs ({', '.join(args.sizes)} x a 1/2/4 token ladder), "
            f"N {s['n_min']:.3g}-{s['n_max']:.3g} non-embedding parameters, D {s['d_min']:.3g}-{s['d_max']:.3g} "
            f"tokens, {sweep_s / 60:.1f} min. Fit: E {p['E']:.3f}, A {p['A']:.3g}, alpha {p['alpha']:.3f}, "
            f"B {p['B']:.3g}, beta {p['beta']:.3f}.\n\n"
            "| model | N | D | compute vs largest sweep run | predicted val loss [90% interval] | measured | "
            "predicted/measured - 1 | in interval |\n|---|---:|---:|---:|---:|---:|---:|---|\n"
            f"| {args.big} | {n_big:,} | {int(d_big):,} | {q['flops'] / s['c_max']:.2f}x | {q['loss']:.4f} "
            f"[{q['loss_low']:.4f} - {q['loss_high']:.4f}] | {measured:.4f} | {err:+.2%} | {'yes' if inside else 'no'} |\n\n"
            f"The {args.big} run took {big_s / 60:.1f} min. Wall times on this loaded machine vary by up to 2x "
            "between runs; the losses do not depend on them.\n")
        with open(Path(__file__).with_name("RESULTS.md"), "a") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
