"""In-process step time of one training shape under several precision / compile variants.

Each variant gets its own model (same seed) and fused AdamW; after 3 warm-up steps (compilation
included, timed and printed with the losses) the variants' steps alternate, so a change in the
machine's load lands on all of them. A step: forward, summed token loss / tokens, backward,
clip_grad_norm_(1.0), AdamW step. Random tokens, vocabulary 65 (nanoGPT's shakespeare-char). glibc's
malloc keeps freed blocks for reuse, as a CPU training run sets it (gptforge.runtime.host_memory);
--malloc-default leaves glibc's defaults.

Variants are PRECISION:MODE with MODE eager, block (per-block torch.compile, what
`--train.compile true` does), model (`module.compile()`, whole model) or full (model and loss
compiled as one function); a `-unfused` suffix (fp32:eager-unfused) keeps the three q/k/v matmuls
instead of the fused one (gptforge.model.gpt.Attention.project_qkv). Each line gives the median wall
time and the median process CPU time of a step (CPU time moves less with other processes' load).

    OMP_WAIT_POLICY=PASSIVE python bench/train_step_variants.py a fp32:eager,fp32:block [--repeat 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from gptforge.config import ModelConfig, TrainConfig
from gptforge.model.gpt import GPT
from gptforge.runtime.device import autocast_context
from gptforge.runtime.host_memory import keep_freed_memory
from gptforge.runtime.loss import token_loss_sum
from gptforge.train.optim import build_optimizer
from gptforge.train.parallel.parallelize import apply_compile

SHAPES = {"a": dict(n_layer=4, n_head=4, d_model=128, batch=16), "b": dict(n_layer=6, n_head=6, d_model=384, batch=12)}


def make_step(mc: ModelConfig, variant: str, x: torch.Tensor, y: torch.Tensor):
    prec, mode = variant.split(":")
    mode, _, fused = mode.partition("-")
    torch.manual_seed(0)
    m = GPT(mc)
    m.train()
    if fused == "unfused":
        for block in m.blocks:
            block.attn.fuses_qkv = lambda: False  # type: ignore[method-assign]  # this model only
    elif fused:
        raise SystemExit(f"unknown suffix -{fused}: -unfused or none")
    opt = build_optimizer(m, TrainConfig(lr=1e-3), "cpu")

    def fwd(x, y):
        with autocast_context(torch.device("cpu"), prec):
            logits = m(x)
        return token_loss_sum(logits, y) / y.numel()

    if mode == "block":
        apply_compile(m)
    elif mode == "model":
        m.compile()
    elif mode == "full":
        fwd = torch.compile(fwd)
    elif mode != "eager":
        raise SystemExit(f"unknown mode {mode!r}: eager, block, model or full")

    def step() -> float:
        loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("variants", help="comma-separated PRECISION:MODE, e.g. fp32:eager,fp32:block,bf16:model")
    ap.add_argument("--repeat", type=int, default=10, help="Timed steps per variant (default 10).")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--malloc-default", action="store_true", help="Keep glibc's malloc defaults.")
    args = ap.parse_args()
    if not args.malloc_default:
        keep_freed_memory()
    torch.set_num_threads(args.threads)
    c = SHAPES[args.shape]
    mc = ModelConfig(arch="gpt2", n_layer=c["n_layer"], n_head=c["n_head"], d_model=c["d_model"], block_size=256,
                     vocab_size=65, bias=False, dropout=0.0).resolved()
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, 65, (c["batch"], 256), generator=g) for _ in range(2))
    print(f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}; {args.threads} threads; "
          f"load average {os.getloadavg()[0]:.1f}")
    steps = {}
    for v in args.variants.split(","):
        steps[v] = make_step(mc, v, x, y)
        t0 = time.perf_counter()
        losses = [steps[v]() for _ in range(3)]
        print(f"{v}: first 3 steps {time.perf_counter() - t0:.1f} s, losses {losses}", flush=True)
    times: dict[str, list[float]] = {v: [] for v in steps}
    cpu: dict[str, list[float]] = {v: [] for v in steps}
    for _ in range(args.repeat):
        for v, s in steps.items():
            t, c0 = time.perf_counter(), time.process_time()
            s()
            times[v].append(time.perf_counter() - t)
            cpu[v].append(time.process_time() - c0)
    for v, ts in times.items():
        med = statistics.median(ts)
        print(f"({args.shape}) {v}: median {med * 1000:,.1f} ms, {c['batch'] * 256 / med:,.0f} tokens/s; "
              f"CPU time {statistics.median(cpu[v]) * 1000:,.1f} ms")
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
