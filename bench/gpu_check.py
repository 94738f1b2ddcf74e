"""One script for every GPU figure gptforge reports: sections with their own time caps (~8 min in all).

    python bench/gpu_check.py                   # every section; appends to bench/RESULTS.md
    python bench/gpu_check.py --sections plan   # only the planner's section
    python bench/gpu_check.py --cpu-smoke       # run the code paths on the CPU with tiny shapes

Without CUDA it says so and skips (exit 0); --cpu-smoke exercises the same code on tiny shapes so the
script is known to work before a GPU is booked. Figures go to bench/RESULTS.md with the GPU named,
never into test expectations.

Sections:
  plan  - the planner against the CUDA allocator: a few bf16 AdamW steps of gpt2-small and
          gpt2-medium at several micro-batch sizes, with and without activation checkpointing;
          prints torch.cuda.max_memory_allocated() and max_memory_reserved() beside
          gptforge.plan.predict_peak_memory_bytes() (allocated) and the planner's total (reserved +
          context). The distributed issue adds its sections to SECTIONS below.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GiB = 2**30


def _step_fn(model, opt, dtype, device_type):
    """One optimizer step in the trainer's shape: forward under autocast, fp32 cross-entropy, backward."""
    import torch
    import torch.nn.functional as F

    def step(idx, tgt):
        with torch.autocast(device_type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            logits = model(idx)
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), tgt.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def section_plan(deadline: float, smoke: bool = False) -> list[str]:
    """Measured vs predicted peak memory for a grid of shapes; returns markdown table rows."""
    import torch

    from gptforge.config import ModelConfig, ParallelConfig, TrainConfig
    from gptforge.model.gpt import GPT
    from gptforge.plan import plan as make_plan
    from gptforge.plan import predict_peak_memory_bytes
    from gptforge.runtime.activation import apply_activation_checkpointing

    device = "cpu" if smoke else "cuda"
    if smoke:
        grid = [(dict(preset="gpt2-nano", vocab_size=1000), mb, ac) for mb in (1, 4) for ac in ("none", "full")]
        precision = "bf16"
    else:
        grid = [(dict(preset=p), mb, ac) for p in ("gpt2-small", "gpt2-medium") for mb in (1, 4, 8)
                for ac in ("none", "full")]
        precision = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    rows = ["| model | micro_batch_size | checkpointing | precision | predicted allocated GiB | "
            "max_memory_allocated GiB | difference | predicted total GiB | max_memory_reserved GiB |",
            "|---|---:|---|---|---:|---:|---:|---:|---:|"]
    for model_kw, mb, ac in grid:
        if time.time() > deadline:
            rows.append(f"| (time cap reached before {model_kw['preset']} mb {mb} {ac}) |||||||||")
            break
        mcfg = ModelConfig(**model_kw)
        tcfg = TrainConfig(micro_batch_size=mb, precision=precision, activation_checkpointing=ac)
        predicted = predict_peak_memory_bytes(mcfg, tcfg, ParallelConfig(), device)
        total = make_plan(mcfg, tcfg).memory.total
        cfg = mcfg.resolved()
        torch.manual_seed(0)
        model = GPT(cfg).to(device)
        apply_activation_checkpointing(model, ac)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
        step = _step_fn(model, opt, dtype, device)
        idx = torch.randint(0, cfg.vocab_size, (mb, cfg.block_size), device=device)
        tgt = torch.randint(0, cfg.vocab_size, (mb, cfg.block_size), device=device)
        try:
            step(idx, tgt)  # first step creates the optimizer states
            if device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            for _ in range(2):
                step(idx, tgt)
            if device == "cuda":
                torch.cuda.synchronize()
                alloc = torch.cuda.max_memory_allocated()
                reserved = torch.cuda.max_memory_reserved()
            else:
                alloc = reserved = None
            oom = False
        except torch.OutOfMemoryError:
            alloc = reserved = None
            oom = True
        del model, opt, step, idx, tgt
        if device == "cuda":
            torch.cuda.empty_cache()
        if alloc:
            diff = f"{predicted / alloc - 1:+.1%}"
            a, r = f"{alloc / GiB:.3f}", f"{reserved / GiB:.3f}"
        else:
            diff, a, r = ("OOM" if oom else "n/a (CPU)"), "-", "-"
        row = (f"| {model_kw['preset']} | {mb} | {ac} | {precision} | {predicted / GiB:.3f} | {a} | {diff} | "
               f"{total / GiB:.3f} | {r} |")
        print(row, flush=True)
        rows.append(row)
    return rows


# name -> (function, time cap in seconds). Other issues append their sections here.
SECTIONS = {"plan": (section_plan, 150)}

try:  # the distributed/throughput section lives beside this file
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_check_dist import section_dist

    SECTIONS["dist"] = (section_dist, 300)
except ImportError as _e:  # pragma: no cover - only when the file is missing
    print(f"gpu_check: dist section unavailable ({_e})", file=sys.stderr)


def append_results(path: Path, header: str, blocks: list[tuple[str, list[str]]]) -> None:
    """Append a dated section to RESULTS.md atomically (temp file, fsync, rename)."""
    old = path.read_text() if path.exists() else "# GPU check results\n\nWritten by bench/gpu_check.py.\n"
    text = old.rstrip("\n") + "\n\n" + header + "\n"
    for name, rows in blocks:
        text += f"\n### {name}\n\n" + "\n".join(rows) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".results-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    ap.add_argument("--cpu-smoke", action="store_true", help="run the code paths on the CPU with tiny shapes")
    ap.add_argument("--results", default=str(ROOT / "bench" / "RESULTS.md"), help="markdown file to append to")
    args = ap.parse_args(argv)
    import torch

    names = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        print(f"gpu_check: unknown section(s) {unknown}; known: {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() and not args.cpu_smoke:
        print("gpu_check: no CUDA device here; skipping every section (use --cpu-smoke to exercise the code).")
        return 0
    gpu = "CPU smoke run" if args.cpu_smoke else torch.cuda.get_device_name()
    blocks = []
    for name in names:
        fn, cap = SECTIONS[name]
        print(f"== {name} (cap {cap} s) on {gpu}", flush=True)
        start = time.time()
        rows = fn(start + cap, smoke=args.cpu_smoke)
        blocks.append((f"{name} ({time.time() - start:.0f} s)", rows))
    if not args.cpu_smoke:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
        header = f"## {stamp}: {gpu}, torch {torch.__version__}, CUDA {torch.version.cuda}"
        append_results(Path(args.results), header, blocks)
        print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
