"""Learning-rate sweep behind gptforge.train.optim.default_lr (size-aware defaults).

Trains tiny GPT-2-style models (n_layer 2, d_model in --widths, --block-size, --batch, AdamW,
cosine, warmup 5%, head dim 32) at each lr of --lrs for --steps steps (and the first width again for --long-steps), on
a text file you name, and prints the final val loss of each run and the best lr per width, with
width * best lr (the constant of lr = c / d_model).

    python bench/lr_sweep.py --text corpus.txt --widths 64,128 --lrs 1e-3,3e-3,1e-2,3e-2 --steps 150

The CPU is named in the output; figures go to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from machine import cpu_description  # bench/machine.py


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--text", required=True, help="a plain-text corpus (e.g. a public-domain book)")
    ap.add_argument("--widths", default="64,128")
    ap.add_argument("--lrs", default="1e-3,3e-3,1e-2,3e-2")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--long-steps", type=int, default=0, help="also sweep the first width at this length")
    ap.add_argument("--vocab-size", type=int, default=512)
    ap.add_argument("--eval-steps", type=int, default=10)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch

    from gptforge.config import ModelConfig, RunConfig, TrainConfig
    from gptforge.data.prepare import PrepareConfig, prepare
    from gptforge.train.run import train

    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_description()}; torch {torch.__version__}; threads {torch.get_num_threads()}; "
          f"load average at start {os.getloadavg()[0]:.1f}")
    work = Path(tempfile.mkdtemp(prefix="lr_sweep_"))
    data = work / "data"
    prepare(PrepareConfig(inputs=[args.text], out=str(data), vocab_size=args.vocab_size, val_fraction=0.05,
                          workers=1, doc_separator="\n\n"), show_progress=False)
    widths = [int(w) for w in args.widths.split(",")]
    lrs = [float(x) for x in args.lrs.split(",")]
    plan = [(w, args.steps) for w in widths] + ([(widths[0], args.long_steps)] if args.long_steps else [])
    t_start, cpu_start = time.time(), time.process_time()
    for width, steps in plan:
        results = []
        for lr in lrs:
            cfg = RunConfig(
                model=ModelConfig(arch="gpt2", n_layer=2, n_head=max(1, width // 32), d_model=width, block_size=args.block_size,
                                  bias=False),
                train=TrainConfig(max_steps=steps, micro_batch_size=args.batch, lr=lr, warmup_steps=max(1, steps // 20),
                                  eval_interval=steps, eval_steps=args.eval_steps, checkpoint_interval=0,
                                  tensorboard=False, report=False, spike_alarms=False, seed=1))
            t0 = time.time()
            res = train(cfg, data, work / f"run_{width}_{steps}_{lr:g}", progress=False)
            results.append((lr, res.val_loss))
            print(f"d_model {width:4d} steps {steps:4d} lr {lr:8.4g}: val loss {res.val_loss:.4f} "
                  f"({time.time() - t0:.0f} s)", flush=True)
        best_lr, best = min(results, key=lambda r: r[1])
        print(f"==> d_model {width} steps {steps}: best lr {best_lr:g} (val {best:.4f}); d_model * lr = "
              f"{width * best_lr:.3g}", flush=True)
    print(f"total {time.time() - t_start:.0f} s wall, {time.process_time() - cpu_start:.0f} s CPU; load average at "
          f"end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
