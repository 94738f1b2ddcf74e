"""Training throughput on the CPU: gptforge `pretrain` beside nanoGPT's train.py, same shapes.

Configurations (nanoGPT's shakespeare-char shapes):
  (a) n_layer=4, n_head=4, d_model=128, block_size=256, batch 16
  (b) n_layer=6, n_head=6, d_model=384, block_size=256, batch 12
Variants: gptforge in fp32 and bf16 autocast, each eager and with `--train.compile true` (and fp32
`eager-blas`: eager with `--train.onednn_linear false`, torch's default BLAS products); nanoGPT
eager and with `--compile=True` (its train.py runs fp32 on a CPU whatever --dtype says: it autocasts
on CUDA only, so fp32 is its only CPU precision). One line per variant: median tokens/s over the
timed steps (best of --repeat runs; all variants alternate within each repeat, so a slow spell of
the shared machine does not land on one side only), MFU against the measured CPU matmul peak,
the mean train loss of the last 10 steps (both tools) and gptforge's validation loss (20 fixed
batches) after the same number of steps. Two summary rows per shape: best against best (each
tool's fastest variant) and fp32 eager like for like. The CPU model, its AVX-512 / bf16 / AMX
flags and the load average are printed with the figures.

gptforge runs with full logging (metrics.jsonl, TensorBoard), evaluation and checkpointing on.
Both train on the same character-level corpus (tinyshakespeare from ../shared/data when present,
else the Python standard library's text), with the same vocabulary, bias-free linear layers and no
dropout, as nanoGPT's shakespeare_char configuration does.

nanoGPT is not part of gptforge: fetch it yourself and point NANOGPT_DIR at the checkout. Without
it, the benchmark prints gptforge's figures alone.

    NANOGPT_DIR=/path/to/nanoGPT python bench/train_throughput.py [--steps 40] [--configs a,b]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from machine import cpu_description  # bench/machine.py

REPO = Path(__file__).resolve().parents[1]
CONFIGS = {
    "a": dict(n_layer=4, n_head=4, d_model=128, block_size=256, batch=16),
    "b": dict(n_layer=6, n_head=6, d_model=384, block_size=256, batch=12),
}


def corpus_text() -> tuple[str, str]:
    shakespeare = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"
    if shakespeare.exists():
        return shakespeare.read_text(), "tinyshakespeare"
    sys.path.insert(0, str(REPO))
    from gptforge.data.stdlib_corpus import stdlib_files

    text = "".join(p.read_text(errors="replace") for p in stdlib_files()[:200])
    return text, "standard library (200 files)"


def write_data(text: str, root: Path) -> tuple[Path, Path, int]:
    """Char-level ids written both as nanoGPT's data/bench/{train,val}.bin + meta.pkl and as a
    gptforge shard folder (meta.json + .bin). Returns (nanogpt_dir, shard_dir, vocab)."""
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    n = int(0.9 * len(ids))
    nano = root / "nanogpt_data" / "bench"
    nano.mkdir(parents=True)
    ids[:n].tofile(nano / "train.bin")
    ids[n:].tofile(nano / "val.bin")
    with open(nano / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars)}, f)
    shards = root / "shards"
    shards.mkdir()
    # gptforge shards end with the EOS id (0 here: the first character, a newline).
    train_ids, val_ids = np.append(ids[:n], np.uint16(0)), np.append(ids[n:], np.uint16(0))
    train_ids.tofile(shards / "train_000.bin")
    val_ids.tofile(shards / "val_000.bin")
    meta = {
        "format": "gptforge-shards", "format_version": 1, "tokenizer_sha256": "char-level (benchmark)",
        "vocab_size": len(chars), "dtype": "uint16", "eos_id": 0,
        "splits": {
            "train": {"tokens": len(train_ids), "documents": 1, "bytes": len(text[:n].encode()), "files": ["train_000.bin"]},
            "val": {"tokens": len(val_ids), "documents": 1, "bytes": len(text[n:].encode()), "files": ["val_000.bin"]},
            "test": {"tokens": 0, "documents": 0, "bytes": 0, "files": []},
        },
        "prepare_config": {"benchmark": "char-level"}, "gptforge_version": "bench",
    }
    (shards / "meta.json").write_text(json.dumps(meta))
    return nano.parent, shards, len(chars)




def _label(variant) -> str:
    return ("compile" if variant else "eager") if isinstance(variant, bool) else variant


def _mode(name: str) -> bool | str:
    """A gptforge variant's compile mode: eager -> False, compile -> True, auto -> "auto",
    eager-blas -> "eager-blas" (eager with `--train.onednn_linear false`: torch's BLAS products)."""
    if name not in ("eager", "compile", "auto", "eager-blas"):
        raise SystemExit(f"--variants: mode {name!r} is not eager, compile, auto or eager-blas")
    return name if name in ("auto", "eager-blas") else name == "compile"


def load() -> str:
    return "load average " + " / ".join(f"{x:.1f}" for x in os.getloadavg())


def run_gptforge(shards: Path, out: Path, c: dict, precision: str, compile: bool | str, steps: int,
                 threads: int, activation: str | None = None) -> dict:
    act = ["--model.activation", activation] if activation else []
    if compile == "eager-blas":
        act, compile = [*act, "--train.onednn_linear", "false"], False
    cmd = [sys.executable, "-m", "gptforge.cli", "pretrain", *act, "--data", str(shards), "--out", str(out),
           "--model.arch", "gpt2", "--model.n_layer", str(c["n_layer"]), "--model.n_head", str(c["n_head"]),
           "--model.d_model", str(c["d_model"]), "--model.block_size", str(c["block_size"]),
           "--model.bias", "false", "--model.dropout", "0.0",
           "--train.micro_batch_size", str(c["batch"]), "--train.max_steps", str(steps),
           "--train.precision", precision, "--train.compile", str(compile).lower(),
           "--train.eval_interval", str(steps), "--train.eval_steps", "20",
           "--train.checkpoint_interval", str(steps // 2), "--train.warmup_steps", "5",
           "--train.num_threads", str(threads), "--train.lr", "1e-3", "--quiet"]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))  # as nanoGPT's run gets
    env.pop("GPTFORGE_AUTO_COMPILE", None)  # auto measures
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise RuntimeError(f"gptforge failed:\n{proc.stderr[-2000:]}")
    said = re.search(r"train.compile auto -> .*", proc.stdout + proc.stderr)
    if compile == "auto":
        import yaml

        chose = (yaml.safe_load((out / "config.yaml").read_text()) or {}).get("train", {}).get("compile")
        print(f"  {precision} train.compile auto chose {chose}" + (f": {said.group(0)}" if said else ""), flush=True)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "tokens_per_second" in r]
    timed = rows[3:]  # skip warm-up steps (and compilation)
    return {
        "tokens_per_second": statistics.median(r["tokens_per_second"] for r in timed),
        # None where the trainer found the measured peak implausible (a CPU's peak moves with its load).
        "mfu": statistics.median(r["mfu"] for r in timed) if all(r["mfu"] for r in timed) else None,
        "train_loss": statistics.fmean(r["loss"] for r in rows[-10:]),
        "val_loss": next(r["val_loss"] for r in reversed(rows) if "val_loss" in r),
    }


def run_nanogpt(nanogpt_dir: Path, data_root: Path, work: Path, c: dict, compile: bool, steps: int,
                threads: int, passive: bool = False) -> dict:
    w = work / "nanogpt"
    shutil.copytree(nanogpt_dir, w, ignore=shutil.ignore_patterns(".git", "data", "assets"))
    shutil.copytree(data_root, w / "data")
    cmd = [sys.executable, "train.py", "--dataset=bench", "--device=cpu", f"--compile={compile}", "--dtype=float32",
           f"--n_layer={c['n_layer']}", f"--n_head={c['n_head']}", f"--n_embd={c['d_model']}",
           f"--block_size={c['block_size']}", f"--batch_size={c['batch']}", "--gradient_accumulation_steps=1",
           "--dropout=0.0", f"--max_iters={steps}", f"--lr_decay_iters={steps}", "--eval_interval=100000",
           "--eval_iters=1", "--log_interval=1", "--warmup_iters=5", "--learning_rate=1e-3",
           "--always_save_checkpoint=False", f"--out_dir={work / 'nano_out'}"]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if passive:  # what gptforge's CLI sets by default (an explicit value wins)
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    proc = subprocess.run(cmd, cwd=w, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise RuntimeError(f"nanoGPT failed:\n{proc.stderr[-2000:]}")
    found = re.findall(r"iter \d+: loss ([\d.]+), time ([\d.]+)ms", proc.stdout)
    ms = [float(t) for _, t in found]
    timed = ms[3:]
    return {"tokens_per_second": c["batch"] * c["block_size"] / (statistics.median(timed) / 1000),
            "train_loss": statistics.fmean(float(v) for v, _ in found[-10:])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40, help="Optimizer steps per run (default 40).")
    ap.add_argument("--configs", default="a,b", help="Which configurations (default a,b).")
    ap.add_argument("--variants", default="fp32:eager,fp32:compile,bf16:eager,bf16:compile",
                    help="gptforge variants, precision:eager|compile|auto|eager-blas[:activation] (auto: `--train.compile "
                         "auto`, which prints its choice; default the four fixed ones with the gpt2 default "
                         "activation); e.g. fp32:eager:gelu,fp32:eager:gelu_tanh compares exact and tanh GELU.")
    ap.add_argument("--nano-variants", default="eager,compile,eager-passive,compile-passive",
                    help="nanoGPT variants: eager, compile, and either with -passive: OMP_WAIT_POLICY=PASSIVE, "
                         "which gptforge's CLI sets by default (default all four).")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads for both.")
    ap.add_argument("--repeat", type=int, default=2, help="Alternating runs per variant; the best is kept (default 2).")
    args = ap.parse_args()
    nano = os.environ.get("NANOGPT_DIR")
    nano_dir = Path(nano) if nano else None
    if nano_dir is not None and not (nano_dir / "train.py").exists():
        print(f"NANOGPT_DIR={nano_dir} has no train.py; running gptforge alone")
        nano_dir = None
    import torch

    text, source = corpus_text()
    print(f"CPU: {cpu_description()}; torch {torch.__version__}")
    print(f"corpus: {source}, {len(text):,} characters; {args.steps} steps per run; {args.threads} threads; {load()}")
    ours = [(v.split(":")[0], _mode(v.split(":")[1]), (v.split(":") + [None])[2]) for v in args.variants.split(",")]
    theirs = [v for v in args.nano_variants.split(",")] if nano_dir else []
    # Interleaved order: nanoGPT eager, gptforge fp32 eager, nanoGPT compile, gptforge ..., so both
    # tools' runs alternate within each repeat.
    order = [("nanoGPT", "fp32", c, None) for c in theirs]
    for i, o in enumerate(ours):
        order.insert(min(2 * i + 1, len(order)), ("gptforge", *o))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data_root, shards, vocab = write_data(text, tmp)
        print(f"char-level vocabulary {vocab}")
        for key in args.configs.split(","):
            c = CONFIGS[key]
            shape = f"({key}) L={c['n_layer']} H={c['n_head']} d={c['d_model']} T={c['block_size']} B={c['batch']}"
            best: dict[tuple, dict] = {}
            loads = [load()]
            for rep in range(args.repeat):
                for n, (tool, prec, comp, act) in enumerate(order):
                    work = tmp / f"{key}{rep}{n}"
                    r = (run_nanogpt(nano_dir, data_root, work, c, comp.startswith("compile"), args.steps, args.threads,
                                     passive=comp.endswith("-passive")) if tool == "nanoGPT"
                         else run_gptforge(shards, work, c, prec, comp, args.steps, args.threads, act))
                    k = (tool, prec, comp, act)
                    if k not in best or r["tokens_per_second"] > best[k]["tokens_per_second"]:
                        best[k] = r
                    shutil.rmtree(work, ignore_errors=True)
                loads.append(load())
            ref_key = next((k for k in best if k[:3] == ("gptforge", "fp32", False)), None)
            ref_val = best[ref_key]["val_loss"] if ref_key else None
            for (tool, prec, comp, act), r in best.items():
                line = (f"{shape} {tool:>8} {prec} {_label(comp):>13}{' ' + act if act else ''}: "
                        f"{r['tokens_per_second']:>8,.0f} tok/s, train loss (last 10) {r['train_loss']:.4f}")
                if tool == "gptforge":
                    mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
                    line += f", MFU {mfu} of measured {prec} peak, val loss {r['val_loss']:.4f}"
                    if ref_val is not None and (tool, prec, comp, act) != ref_key:
                        line += f" (fp32 eager {r['val_loss'] - ref_val:+.4f})"
                print(line, flush=True)
            g = {k: v for k, v in best.items() if k[0] == "gptforge"}
            n = {k: v for k, v in best.items() if k[0] == "nanoGPT"}
            if g and n:
                gk = max(g, key=lambda k: g[k]["tokens_per_second"])
                nk = max(n, key=lambda k: n[k]["tokens_per_second"])
                ratio = g[gk]["tokens_per_second"] / n[nk]["tokens_per_second"]
                print(f"{shape} best vs best: gptforge {gk[1]} {_label(gk[2])} "
                      f"{g[gk]['tokens_per_second']:,.0f} / nanoGPT {nk[1]} {_label(nk[2])} "
                      f"{n[nk]['tokens_per_second']:,.0f} tok/s = {ratio:.2f}x")
                a = g.get(ref_key)
                for nv, what in (("eager", "nanoGPT's default environment"),
                                 ("eager-passive", "both OMP_WAIT_POLICY=PASSIVE")):
                    b = n.get(("nanoGPT", "fp32", nv, None))
                    if a and b:
                        print(f"{shape} fp32 eager like for like ({what}): {a['tokens_per_second']:,.0f} / "
                              f"{b['tokens_per_second']:,.0f} tok/s = "
                              f"{a['tokens_per_second'] / b['tokens_per_second']:.2f}x")
            print(f"{shape} {' -> '.join(loads)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
