"""Learning efficiency on the CPU: val loss against CPU seconds for the GPT-2 recipe with the
size-aware defaults, the modern preset with AdamW, and the modern preset with Muon; and the CPU
seconds each needs to reach the GPT-2 recipe's final val loss (evaluations every steps/8).

    python bench/learning_efficiency.py --text corpus.txt --width 64 --steps 400 --seeds 1,2

Same tokenizer, data, shape (n_layer 2 for width 64, block 64, batch 8), steps and schedule for
every recipe; val loss (nats/token, so directly comparable) over --eval-steps fixed batches at
the end; CPU seconds are this process's user + system time for the training call (fair on a
loaded machine). Prints the CPU, the load average, each run and the mean/spread per recipe.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--text", required=True)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--vocab-size", type=int, default=1024)
    ap.add_argument("--eval-steps", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--muon-lr", type=float, default=None, help="train.muon_lr (default: resolve_defaults')")
    args = ap.parse_args()

    import torch
    from lr_sweep import cpu_name  # bench/ is on sys.path when this script runs

    from gptforge.config import ModelConfig, RunConfig, TrainConfig
    from gptforge.data.prepare import PrepareConfig, prepare
    from gptforge.train.loop import train
    from gptforge.train.optim import resolve_defaults

    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_name()}; torch {torch.__version__}; threads {args.threads}; load average at start "
          f"{os.getloadavg()[0]:.1f}")
    work = Path(tempfile.mkdtemp(prefix="learn_eff_"))
    data = work / "data"
    prepare(PrepareConfig(inputs=[args.text], out=str(data), vocab_size=args.vocab_size, val_fraction=0.05,
                          workers=1, doc_separator="\n\n"), show_progress=False)
    w = args.width
    shape = dict(n_layer=args.layers, n_head=max(1, w // 32), d_model=w, block_size=64)
    recipes = {
        "gpt2 + adamw (size-aware lr)": (ModelConfig(preset="gpt2-nano", **shape), "adamw"),
        "modern + adamw": (ModelConfig(preset="modern-nano", **shape), "adamw"),
        "modern + muon": (ModelConfig(preset="modern-nano", **shape), "muon"),
    }
    summary = {}
    for name, (mc, opt) in recipes.items():
        for seed in [int(s) for s in args.seeds.split(",")]:
            tc = resolve_defaults(mc, TrainConfig(max_steps=args.steps, micro_batch_size=8, optimizer=opt,
                                                  muon_lr=args.muon_lr, eval_interval=max(1, args.steps // 8), eval_steps=args.eval_steps,
                                                  checkpoint_interval=0, tensorboard=False, report=False,
                                                  spike_alarms=False, seed=seed))
            c0, t0 = time.process_time(), time.time()
            res = train(RunConfig(model=mc, train=tc), data, work / f"{name.split()[0]}_{opt}_{seed}", progress=False)
            cpu = time.process_time() - c0
            curve = [(r["step"], r["val_loss"]) for r in res.history if r.get("val_loss") is not None]
            summary.setdefault(name, []).append((res.val_loss, cpu, curve))
            print(f"{name:30s} seed {seed}: val loss {res.val_loss:.4f}, {cpu:.1f} CPU s ({time.time() - t0:.0f} s "
                  f"wall; lr {tc.lr:g}{f', muon_lr {tc.muon_lr:g}' if opt == 'muon' else ''})", flush=True)
    print(f"load average at end {os.getloadavg()[0]:.1f}")
    # CPU seconds to reach the first recipe's mean final val loss: the first evaluation at or below
    # it, as a fraction of the run's steps times the run's CPU seconds (steps cost the same).
    target = statistics.mean(r[0] for r in next(iter(summary.values())))
    print(f"target: {target:.4f} (first recipe's mean final val loss); evaluations every {max(1, args.steps // 8)} "
          "steps")
    print("| recipe | final val loss (mean ± half range) | CPU s per run | CPU s to target |")
    for name, rows in summary.items():
        losses, cpus = [r[0] for r in rows], [r[1] for r in rows]
        spread = (max(losses) - min(losses)) / 2
        reach = []
        for _, cpu, curve in rows:
            step = next((s for s, v in curve if v <= target + 1e-9), None)
            reach.append(cpu * step / args.steps if step is not None else float("nan"))
        print(f"| {name} | {statistics.mean(losses):.4f} ± {spread:.4f} | {statistics.mean(cpus):.1f} | "
              f"{statistics.mean(reach):.1f} |")


if __name__ == "__main__":
    main()
