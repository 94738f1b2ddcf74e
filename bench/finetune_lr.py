"""Learning-rate sweep behind gptforge.train.optim.finetune_lr (fine-tuning defaults per method).

Pretrains a small GPT-2-style model with gptforge (n_layer 2, --width, --pretrain-steps steps on
a text file you name), then fine-tunes it with LoRA and with full fine-tuning on generated
instructions (prompt/completion rows: reverse or repeat a short word; the loss counts completion
tokens) for --steps steps at each lr of --lora-lrs / --full-lrs, and prints the held-out
completion loss of each run beside the rule's lr for that width.

    python bench/finetune_lr.py --text corpus.txt --width 64 --steps 60

The CPU and load average are printed with the figures; they go to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

from machine import cpu_description  # bench/machine.py


def _rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        word = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 5)))
        task = rng.choice(["reverse", "repeat"])
        rows.append({"prompt": f"{task}: {word}\n", "completion": word[::-1] if task == "reverse" else word + " " + word})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--text", required=True, help="a plain-text corpus (e.g. a public-domain book)")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--pretrain-steps", type=int, default=300)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--lora-lrs", default="2e-4,6e-4,2e-3,6e-3")
    ap.add_argument("--full-lrs", default="6e-5,2e-4,6e-4,2e-3")
    ap.add_argument("--methods", default="lora,full", help="which sweeps to run (lora, full or both)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch

    from gptforge.config import FinetuneConfig, ModelConfig, RunConfig, TrainConfig
    from gptforge.data.prepare import PrepareConfig, prepare
    from gptforge.train.loggers import read_metrics
    from gptforge.train.optim import finetune_lr
    from gptforge.train.run import train
    from gptforge.train.workflows.finetune import finetune

    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_description()}; torch {torch.__version__}; threads {torch.get_num_threads()}; "
          f"load average at start {os.getloadavg()[0]:.1f}")
    work = Path(tempfile.mkdtemp(prefix="finetune_lr_"))
    prepare(PrepareConfig(inputs=[args.text], out=str(work / "data"), vocab_size=512, val_fraction=0.05, workers=1,
                          doc_separator="\n\n"), show_progress=False)
    t0 = time.time()
    base = work / "base"
    model = ModelConfig(arch="gpt2", n_layer=2, n_head=max(1, args.width // 32), d_model=args.width, block_size=64)
    train(RunConfig(model=model, train=TrainConfig(max_steps=args.pretrain_steps, micro_batch_size=16, eval_interval=0,
                                                   checkpoint_interval=0, tensorboard=False, report=False, seed=0)),
          str(work / "data"), base, progress=False)
    print(f"pretrained d_model {args.width}: {args.pretrain_steps} steps in {time.time() - t0:.0f} s, final loss "
          f"{read_metrics(base)[-1]['loss']:.3f}")
    data = work / "instructions.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _rows(600)))
    methods = args.methods.split(",")
    for method, lrs in [(m, lrs) for m, lrs in (("lora", args.lora_lrs), ("full", args.full_lrs)) if m in methods]:
        rule = finetune_lr(method, args.width)
        for lr in [float(x) for x in lrs.split(",")]:
            run = work / f"{method}_{lr:g}"
            t = time.time()
            fc = FinetuneConfig(method=method, block_size=64, val_fraction=0.1)
            tc = TrainConfig(max_steps=args.steps, micro_batch_size=8, lr=lr, eval_interval=args.steps, eval_steps=20,
                             checkpoint_interval=0, tensorboard=False, report=False, seed=0, weight_decay=0.0,
                             device="cpu")
            finetune(fc, RunConfig(train=tc), base, data, run, progress=False)
            rows = read_metrics(run)
            vals = [r["val_loss"] for r in rows if "val_loss" in r]
            val = f"{vals[-1]:.3f}" if vals else f"none (stopped at step {rows[-1]['step'] if rows else 0})"
            print(f"{method:4s} lr {lr:8.1e}  completion val loss {val}  (first train loss {rows[0]['loss']:.3f}) "
                  f"{time.time() - t:.0f} s, load {os.getloadavg()[0]:.1f}" + ("   <- rule" if abs(lr - rule) / rule < 0.2
                                                                                 else ""))
        print(f"{method}: finetune_lr rule for d_model {args.width}: {rule:g}")


if __name__ == "__main__":
    main()
