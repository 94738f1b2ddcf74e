"""GPU check section for distributed training (issue: distributed), to be merged into
bench/gpu_check.py as SECTIONS["dist"] = (section_dist, 300).

bf16 training through gptforge's own `train()` (the loop `gptforge pretrain` runs) for 50 steps:
gpt2-small and llama-160m with torch.compile off and on, and gpt2-small under FSDP2 on one rank
(ZeRO-3, a one-process group) with full activation checkpointing. Each line: median tokens/s over
the steps after the first 10, MFU (PaLM formula against the GPU's dense bf16 peak) and the CUDA
allocator's peak.

    python bench/gpu_check_dist.py               # needs CUDA; prints the markdown rows
    python bench/gpu_check_dist.py --cpu-smoke   # the same code paths on the CPU, tiny shapes

Data: a small shard folder prepared from the Python standard library's text (the model's
vocabulary is set to the preset's; throughput does not depend on the text).

When NANOGPT_DIR names a nanoGPT checkout (fetched beside the project, never committed), its
train.py runs gpt2-small's shapes on the same GPU, data and batch (bf16, compile on), and the row
shows its tokens/s and the MFU our formula gives it, for the target "gptforge gpt2-small bf16 +
compile MFU at or above nanoGPT's, measured in the same run".
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GiB = 2**30


def _prepare(out: Path, smoke: bool) -> Path:
    from gptforge.data.prepare import PrepareConfig, prepare
    from gptforge.data.stdlib_corpus import stdlib_files

    files = stdlib_files()
    files = files[:: max(1, len(files) // (40 if smoke else 400))]
    cfg = PrepareConfig(inputs=[str(p) for p in files], out=str(out), vocab_size=512 if smoke else 4096,
                        val_fraction=0.01, workers=1 if smoke else 4)
    prepare(cfg, show_progress=False)
    return out


def _runs(smoke: bool) -> list[tuple[str, dict, dict, dict]]:
    if smoke:
        model = {"gpt2": dict(preset="gpt2-nano", vocab_size=1024, block_size=64),
                 "llama": dict(preset="llama-nano", vocab_size=1024, block_size=64)}
        mbs, steps, compile_opts = 2, 4, (False,)
    else:
        model = {"gpt2": dict(preset="gpt2-small", vocab_size=50304, block_size=1024),
                 "llama": dict(preset="llama-160m", vocab_size=32000, block_size=1024)}
        mbs, steps, compile_opts = 16, 50, (False, True)
    base = dict(max_steps=steps, micro_batch_size=mbs, precision="bf16", eval_interval=0, checkpoint_interval=0,
                warmup_steps=5, tensorboard=False, lr=6e-4)
    out = []
    for m in model.values():
        for c in compile_opts:
            out.append((f"{m['preset']} bf16 compile={'on' if c else 'off'}", m, dict(base, compile=c), {}))
    out.append((f"{model['gpt2']['preset']} bf16 FSDP2 1 rank + full AC compile={'on' if compile_opts[-1] else 'off'}",
                model["gpt2"], dict(base, compile=compile_opts[-1], activation_checkpointing="full"),
                dict(zero_stage=3)))
    return out


def _nanogpt_row(nano_dir: Path, data: Path, work: Path, smoke: bool) -> str:
    """nanoGPT's train.py on the gpt2 shapes of `_runs`, same data and batch; one markdown row."""
    import json

    import numpy as np

    from gptforge.config import ModelConfig
    from gptforge.model.gpt import GPT
    from gptforge.plan.flops import flops_per_token
    from gptforge.train.mfu import device_peak

    m = _runs(smoke)[0][1]
    mbs, steps = (2, 4) if smoke else (16, 50)
    cfg = ModelConfig(**m).resolved()
    meta = json.loads((data / "meta.json").read_text())
    w = work / "nanogpt"
    shutil.copytree(nano_dir, w, ignore=shutil.ignore_patterns(".git", "data", "assets"))
    d = w / "data" / "gptforge"
    d.mkdir(parents=True)
    for split in ("train", "val"):
        ids = np.concatenate([np.fromfile(data / f, dtype=meta["dtype"]) for f in meta["splits"][split]["files"]])
        ids.astype(np.uint16).tofile(d / f"{split}.bin")
    with open(d / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": cfg.vocab_size}, f)
    dev = "cpu" if smoke else "cuda"
    cmd = [sys.executable, "train.py", "--dataset=gptforge", f"--device={dev}", f"--compile={not smoke}",
           "--dtype=bfloat16", f"--n_layer={cfg.n_layer}", f"--n_head={cfg.n_head}", f"--n_embd={cfg.d_model}",
           f"--block_size={cfg.block_size}", f"--batch_size={mbs}", "--gradient_accumulation_steps=1",
           "--dropout=0.0", "--bias=True", f"--max_iters={steps}", f"--lr_decay_iters={steps}",
           "--eval_interval=100000", "--eval_iters=1", "--log_interval=1", "--warmup_iters=5",
           "--always_save_checkpoint=False", f"--out_dir={work / 'nano_out'}"]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=w, capture_output=True, text=True)
    if proc.returncode:
        return f"| nanoGPT train.py | failed: {proc.stderr.strip().splitlines()[-1][:150] if proc.stderr else proc.returncode} | | | |"
    ms = [float(x) for x in re.findall(r"iter \d+: loss [\d.]+, time ([\d.]+)ms", proc.stdout)]
    timed = ms[10:] or ms[-2:]
    tps = mbs * cfg.block_size / (statistics.median(timed) / 1000)
    with __import__("torch").device("meta"):
        n = GPT(cfg).num_params()
    import torch

    peak = device_peak(torch.device(dev), "bf16").flops_per_second
    mfu = f"{100 * tps * flops_per_token(cfg, n, cfg.block_size) / peak:.1f}%" if peak else "n/a"
    label = f"nanoGPT train.py {m['preset']} shapes bf16 compile={'off' if smoke else 'on'}"
    return f"| {label} | {tps:,.0f} | {mfu} | n/a | {time.time() - t0:.0f} |"


def section_dist(deadline: float, smoke: bool = False) -> list[str]:
    """Markdown rows: configuration, tokens/s, MFU, peak GiB, wall seconds."""
    import torch

    from gptforge.config import ModelConfig, ParallelConfig, RunConfig, TrainConfig
    from gptforge.train.run import train

    rows = ["| configuration | tokens/s (median) | MFU | peak allocated GiB | wall s |", "|---|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as tmp:
        data = _prepare(Path(tmp) / "data", smoke)
        for i, (label, m, t, p) in enumerate(_runs(smoke)):
            if time.time() > deadline:
                rows.append(f"| (time cap reached before {label}) | | | | |")
                break
            t0 = time.time()
            try:
                cfg = RunConfig(model=ModelConfig(**m), train=TrainConfig(**t), parallel=ParallelConfig(**p))
                if torch.cuda.is_available():
                    torch.cuda.reset_peak_memory_stats()
                res = train(cfg, data, Path(tmp) / f"run{i}", progress=False)
            except Exception as e:  # one failing configuration must not hide the others' figures
                rows.append(f"| {label} | failed: {type(e).__name__}: {str(e)[:120]} | | | |")
                continue
            timed = res.history[10:] or res.history[-2:]
            tps = statistics.median(r["tokens_per_second"] for r in timed)
            mfus = [r["mfu"] for r in timed if r["mfu"] is not None]
            mfu = f"{100 * statistics.median(mfus):.1f}%" if mfus else "n/a"
            peak = max((r["peak_memory_bytes"] or 0) for r in res.history)
            rows.append(f"| {label} | {tps:,.0f} | {mfu} | {peak / GiB:.2f} | {time.time() - t0:.0f} |")
            print(rows[-1], flush=True)
        nano = os.environ.get("NANOGPT_DIR")
        if nano and (Path(nano) / "train.py").exists() and time.time() < deadline:
            rows.append(_nanogpt_row(Path(nano), data, Path(tmp), smoke))
            print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-smoke", action="store_true", help="run the code paths on the CPU with tiny shapes")
    ap.add_argument("--cap", type=float, default=300, help="time cap in seconds (default 300)")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available() and not args.cpu_smoke:
        print("gpu_check_dist: no CUDA device here; skipping (use --cpu-smoke to exercise the code).")
        return 0
    print(f"device: {'CPU smoke run' if args.cpu_smoke else torch.cuda.get_device_name()}")
    print("\n".join(section_dist(time.time() + args.cap, smoke=args.cpu_smoke)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
