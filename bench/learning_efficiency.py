"""Learning efficiency on the CPU: val bits per byte against CPU seconds for (a) nanoGPT's README
CPU recipe, (b) gptforge's GPT-2 recipe with the size-aware defaults and (c) the modern recipe
(modern preset + Muon); the CPU seconds each needs to reach the previous one's final value.

    NANOGPT_DIR=<nanoGPT checkout> python bench/learning_efficiency.py CORPUS_FOLDER --seeds 1,2,3

CORPUS_FOLDER: plain-text documents (*.txt, searched recursively; one file = one document; files
named in --exclude, default metadata.txt, are catalogues and left out).
Each document is read as UTF-8 (Latin-1 when that fails), its byte-order mark dropped, line
endings made LF, NFC-normalised; the same normalised text feeds all three recipes.

Split by document: exact duplicates (same text) and files whose names are near-identical once
`_gut`/`_gut_f` edition suffixes are removed (difflib ratio >= 0.7 within one folder: a modern
and a First Folio edition of one play) are grouped, and whole groups go to val (in an order set
by --split-seed) until --val-fraction of the bytes, so no work is on both sides.

Val bits per byte = (total nats over every val token) / ln 2 / (UTF-8 bytes of the val text):
independent of the tokenizer (characters for nanoGPT, BPE for gptforge). Every val token is
scored once, in consecutive windows of the model's block size. Val text = the val documents
joined by a blank line, the same string for every recipe.

CPU seconds = user + system time of all threads (and waited-for children) of the training
process, from resource.getrusage (nanoGPT: its own `train.py` in a subprocess, read from
/proc/PID/stat at each of its evaluation lines, minus its CPU time at its first output line,
i.e. after imports; gptforge: this process around `gptforge.train.run.train`, minus the time spent
in the full-val evaluations, which are measurement, not training). Fair on a loaded machine.

(a) nanoGPT's README CPU line, run unmodified from NANOGPT_DIR on data written here in its format
(train.bin/val.bin/meta.pkl, character level over the same train/val documents):
`train.py config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20
--log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128
--max_iters=2000 --lr_decay_iters=2000 --dropout=0.0`, plus --always_save_checkpoint=True so
that each of its evaluations (every 250 iterations, from its config) leaves a checkpoint to
score on the whole val text afterwards. The seed: nanoGPT seeds with torch.manual_seed(1337); a
wrapper adds (seed - 1) to that call (seed 1 is nanoGPT's own run).
(b) --gpt2-preset with AdamW and `resolve_defaults`' lr/warmup; (c) --modern-preset with Muon
(train.optimizer muon, resolve_defaults' lr and muon_lr); (d) --qwen3-preset with Muon likewise
(Qwen3 blocks: QK-norm, SwiGLU, no logit cap; the exportable recipe). All: one BPE tokenizer from
`gptforge.data.prepare` (vocabulary by its size rule), the same block, batch and steps. The
summary also compares the recipes at equal CPU seconds: each curve's value at the smallest final
CPU time of all runs (linear between evaluations).
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import math
import os
import pickle
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import unicodedata
from itertools import pairwise
from pathlib import Path

NANOGPT_ARGS = ["config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=20",
                "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4",
                "--n_embd=128", "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0"]
# Runs nanoGPT's train.py as it is, with the seed offset added to its one torch.manual_seed call.
SEED_WRAPPER = ("import runpy, sys, torch\n"
                "off = int(sys.argv.pop(1)); seed = torch.manual_seed\n"
                "torch.manual_seed = lambda s: seed(s + off)\n"
                "sys.argv[0] = 'train.py'; runpy.run_path('train.py', run_name='__main__')\n")


def cpu_seconds() -> float:
    """User + system CPU seconds of this process (all threads) and its waited-for children."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime (+ waited children) of a running process, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / os.sysconf("SC_CLK_TCK")


def read_documents(folder: Path, exclude: str = "metadata.txt") -> dict[str, str]:
    """Relative path -> normalised text of every *.txt under folder but those named `exclude`
    (a comma-separated list of file names: catalogues, not documents)."""
    docs, skip = {}, set(exclude.split(","))
    for p in sorted(folder.rglob("*.txt")):
        if p.name in skip:
            continue
        raw = p.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("latin-1")
        text = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
        docs[str(p.relative_to(folder))] = unicodedata.normalize("NFC", text)
    return docs


def group_documents(docs: dict[str, str]) -> list[list[str]]:
    """Groups of documents that must stay on one side of the split (see the module docstring)."""
    names = list(docs)
    parent = {n: n for n in names}

    def find(n):
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    def stem(n):
        return re.sub(r"_gut(_f)?$", "", Path(n).stem).replace("-", "_")

    by_hash = {}
    for n in names:
        h = hashlib.sha256(docs[n].encode()).hexdigest()
        if h in by_hash:
            parent[find(n)] = find(by_hash[h])
        by_hash.setdefault(h, n)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if Path(a).parent == Path(b).parent and difflib.SequenceMatcher(None, stem(a), stem(b)).ratio() >= 0.7:
                parent[find(a)] = find(b)
    groups = {}
    for n in names:
        groups.setdefault(find(n), []).append(n)
    return list(groups.values())


def split_documents(docs: dict[str, str], val_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """(train names, val names): whole groups to val, in a seeded order, up to val_fraction of the bytes."""
    groups = group_documents(docs)
    size = {tuple(g): sum(len(docs[n].encode()) for n in g) for g in groups}
    budget = val_fraction * sum(size.values())
    val, used = [], 0
    for g in sorted(groups, key=lambda g: hashlib.sha256(f"{seed}:{sorted(g)[0]}".encode()).hexdigest()):
        if used + size[tuple(g)] <= budget:
            val += g
            used += size[tuple(g)]
    return [n for n in docs if n not in val], sorted(val)


def interpolated_reach(curve: list[tuple[float, float]], target: float) -> float:
    """CPU seconds at which a (cpu, bpb) curve first reaches target, linear between evaluations
    (from (0, first value) before the first); nan when it never does."""
    prev = None
    for cpu, v in curve:
        if v <= target:
            if prev is None or prev[1] == v:
                return cpu
            c0, v0 = prev
            return c0 + (cpu - c0) * (v0 - target) / (v0 - v)
        prev = (cpu, v)
    return float("nan")


def value_at(curve: list[tuple[float, float]], cpu: float) -> float:
    """Val bits per byte of a (cpu, bpb) curve at `cpu` CPU seconds, linear between evaluations;
    nan outside the curve's range."""
    for (c0, v0), (c1, v1) in pairwise(curve):
        if c0 <= cpu <= c1:
            return v0 + (v1 - v0) * (cpu - c0) / (c1 - c0) if c1 > c0 else v1
    return curve[-1][1] if curve and abs(curve[-1][0] - cpu) < 1e-9 else float("nan")


def first_reach(curve: list[tuple[float, float]], target: float) -> float:
    """CPU seconds of the first evaluation at or below target (nan when none)."""
    return next((cpu for cpu, v in curve if v <= target), float("nan"))


# ---------------------------------------------------------------------------------------------- (a)

def write_nanogpt_data(folder: Path, train_text: str, val_text: str) -> dict:
    """nanoGPT's character-level format (its data/shakespeare_char/prepare.py): uint16 ids."""
    import numpy as np

    chars = sorted(set(train_text + val_text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (("train", train_text), ("val", val_text)):
        np.array([stoi[c] for c in text], dtype=np.uint16).tofile(folder / f"{name}.bin")
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump(meta, f)
    return meta


def score_nanogpt(nanogpt_dir: Path, ckpt_path: Path, val_ids, n_bytes: int) -> float:
    """Val bits per byte of a nanoGPT checkpoint: every val character scored once, in consecutive
    windows of its block size."""
    import importlib.util

    import torch
    import torch.nn.functional as F

    spec = importlib.util.spec_from_file_location("nanogpt_model", nanogpt_dir / "model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    model = mod.GPT(mod.GPTConfig(**ck["model_args"]))
    state = {k.removeprefix("_orig_mod."): v for k, v in ck["model"].items()}
    model.load_state_dict(state)
    model.eval()
    block = ck["model_args"]["block_size"]
    ids = torch.as_tensor(val_ids.astype("int64"))
    total = 0.0
    with torch.no_grad():
        starts = list(range(0, len(ids) - 1, block))
        for i in range(0, len(starts), 64):
            chunk = starts[i:i + 64]
            full = [s for s in chunk if s + block + 1 <= len(ids)]
            rest = [s for s in chunk if s + block + 1 > len(ids)]
            if full:
                x = torch.stack([ids[s:s + block] for s in full])
                y = torch.stack([ids[s + 1:s + block + 1] for s in full])
                logits, _ = model(x, y)
                total += F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
            for s in rest:
                x, y = ids[s:len(ids) - 1][None], ids[s + 1:][None]
                logits, _ = model(x, y)
                total += F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
    return total / math.log(2) / n_bytes


def run_nanogpt(nanogpt_dir: Path, data: Path, out: Path, seed: int, threads: int, val_ids, n_bytes: int,
                chars_per_byte: float, iters: int = 2000, score_every: int = 500) -> dict:
    """One nanoGPT run; returns its curve of (cpu s, full-val bpb) at the evaluations whose step is a
    multiple of score_every (and the last), and its own 20-batch estimates at every evaluation."""
    out.mkdir(parents=True, exist_ok=True)
    snaps = out / "snapshots"
    snaps.mkdir(exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-u", "-c", SEED_WRAPPER, str(seed - 1), *NANOGPT_ARGS, f"--dataset={data}",
           f"--out_dir={out}", "--always_save_checkpoint=True"]
    if iters != 2000:  # a shorter trial of the script, not the recipe
        cmd += [f"--max_iters={iters}", f"--lr_decay_iters={iters}", f"--eval_interval={max(1, iters // 4)}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(cmd, cwd=nanogpt_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base, evals, tail, pending = None, [], [], None
    pat = re.compile(r"^step (\d+): train loss ([\d.]+), val loss ([\d.]+)")
    for line in proc.stdout:
        now = proc_cpu_seconds(proc.pid)
        if base is None:
            base = now  # imports and start-up done: its first line
        tail = (tail + [line])[-20:]
        if pending is not None:  # the line after "saving checkpoint": its torch.save has returned
            shutil.copy(out / "ckpt.pt", snaps / f"ckpt_{pending}.pt")
            pending = None
        m = pat.match(line)
        if m:
            step, est = int(m.group(1)), float(m.group(3))
            evals.append({"step": step, "cpu": now - base, "est_bpb": est * chars_per_byte / math.log(2)})
        elif line.startswith("saving checkpoint") and evals:
            pending = evals[-1]["step"]
    rc = proc.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if rc != 0:
        raise RuntimeError(f"nanoGPT's train.py failed (exit {rc}):\n{''.join(tail)}")
    if pending is not None:  # the last evaluation's checkpoint
        shutil.copy(out / "ckpt.pt", snaps / f"ckpt_{pending}.pt")
    total = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    for e in evals:
        p = snaps / f"ckpt_{e['step']}.pt"
        if p.exists() and (e["step"] % score_every == 0 or e is evals[-1]):
            e["bpb"] = score_nanogpt(nanogpt_dir, p, val_ids, n_bytes)
    return {"curve": [(e["cpu"], e["bpb"]) for e in evals if "bpb" in e], "evals": evals,
            "cpu_total_process": total, "cpu_startup": base}


# ------------------------------------------------------------------------------------------ (b), (c)

def run_gptforge(recipe: str, mc, opt: str, data_dir: Path, run_dir: Path, seed: int, args, val_tokens,
                 n_bytes: int) -> dict:
    """One gptforge run with a full-val evaluation every steps/evals steps, timed out of the CPU count."""
    from gptforge.config import RunConfig, TrainConfig
    from gptforge.eval.perplexity import evaluate_tokens
    from gptforge.train.optim import resolve_defaults
    from gptforge.train.run import train
    from gptforge.train.sources import ShardSource

    curve, clock = [], {"start": 0.0, "excluded": 0.0}

    class FullValSource(ShardSource):
        """The train shards, with evaluation = every val token (bits per byte on the side)."""

        def batches(self, block_size, tc, dp_rank, dp_size):
            out = super().batches(block_size, tc, dp_rank, dp_size)
            self.has_val = True
            return out

        def evaluate(self, model, device, precision, should_stop=None):
            c0 = cpu_seconds()
            ev = evaluate_tokens(model, val_tokens, n_bytes=n_bytes, stride=model.config.block_size,
                                 batch_size=32)
            curve.append((c0 - clock["start"] - clock["excluded"], ev.bits_per_byte))
            clock["excluded"] += cpu_seconds() - c0
            return ev.loss

    tc = resolve_defaults(mc, TrainConfig(
        max_steps=args.steps, micro_batch_size=args.batch, optimizer=opt, eval_interval=max(1, args.steps // args.evals),
        eval_steps=1, checkpoint_interval=0, keep_checkpoints=1, tensorboard=False, report=False, seed=seed,
        num_threads=args.threads))
    source = FullValSource(data_dir, eval_steps=1, micro_batch_size=args.batch)
    source.has_val = True
    clock["start"] = cpu_seconds()
    t0 = time.time()
    train(RunConfig(model=mc, train=tc), data_dir, run_dir, progress=False, log=lambda s: None, data=source)
    wall = time.time() - t0
    return {"curve": curve, "lr": tc.lr, "muon_lr": tc.muon_lr if opt == "muon" else None,
            "warmup": tc.warmup_steps, "wall": wall}


# ---------------------------------------------------------------------------------------------- main

def summarise(name: str, runs: list[dict]) -> dict:
    finals = [r["curve"][-1][1] for r in runs]
    cpus = [r["curve"][-1][0] for r in runs]
    return {"recipe": name, "final_bpb": finals, "final_cpu": cpus, "bpb_mean": statistics.mean(finals),
            "bpb_sd": statistics.stdev(finals) if len(finals) > 1 else 0.0, "cpu_mean": statistics.mean(cpus)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus", help="folder of *.txt documents")
    ap.add_argument("--nanogpt-dir", default=os.environ.get("NANOGPT_DIR"),
                    help="nanoGPT checkout (default: $NANOGPT_DIR); without it, (a) is skipped")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--val-fraction", type=float, default=0.02)
    ap.add_argument("--split-seed", type=int, default=0)
    ap.add_argument("--exclude", default="metadata.txt", help="file names that are not documents (comma-separated)")
    ap.add_argument("--gpt2-preset", default="gpt2-micro")
    ap.add_argument("--modern-preset", default="modern-micro")
    ap.add_argument("--qwen3-preset", default="qwen3-micro")
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--evals", type=int, default=12, help="full-val evaluations per gptforge run")
    ap.add_argument("--vocab-size", type=int, default=0, help="0: prepare's size rule")
    ap.add_argument("--threads", type=int, default=1, help="threads for every run (OMP_NUM_THREADS for nanoGPT)")
    ap.add_argument("--recipes", default="a,b,c")
    ap.add_argument("--nanogpt-iters", type=int, default=2000, help="only for a quick trial of this script")
    ap.add_argument("--nanogpt-score-every", type=int, default=500,
                    help="score nanoGPT's checkpoints on the whole val text at these steps (and the last)")
    ap.add_argument("--combine", nargs="+", default=None,
                    help="print the summary of --json files written by runs of single recipes (no training)")
    ap.add_argument("--json", default=None, help="write every curve here")
    ap.add_argument("--bpe-dir", default=None,
                    help="keep the BPE shards here and reuse them when present (runs of one recipe or seed each)")
    args = ap.parse_args()

    import numpy as np
    import torch
    from machine import cpu_description  # bench/machine.py (bench/ is on sys.path when this script runs)

    from gptforge.config import ModelConfig
    from gptforge.data.prepare import PrepareConfig, prepare
    from gptforge.data.shards import load_meta
    from gptforge.data.tokenizer import Tokenizer

    if args.combine:
        results = {"runs": {}}
        for f in args.combine:
            part = json.loads(Path(f).read_text())
            for k, v in part["runs"].items():
                results["runs"].setdefault(k, []).extend(v)
        report(results, args)
        return
    torch.set_num_threads(args.threads)
    seeds = [int(s) for s in args.seeds.split(",")]
    recipes = args.recipes.split(",")
    print(f"CPU: {cpu_description()}; torch {torch.__version__}; threads {args.threads}; load average at start "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    docs = read_documents(Path(args.corpus), args.exclude)
    train_names, val_names = split_documents(docs, args.val_fraction, args.split_seed)
    train_text = "\n\n".join(docs[n] for n in train_names)
    val_text = "\n\n".join(docs[n] for n in val_names)
    n_bytes = len(val_text.encode())
    print(f"corpus: {len(docs)} documents, {sum(len(t.encode()) for t in docs.values()):,} bytes; train "
          f"{len(train_names)} documents ({len(train_text.encode()):,} bytes); val {len(val_names)} documents "
          f"({n_bytes:,} bytes, {len(val_text):,} characters): {', '.join(val_names)}", flush=True)

    work = Path(tempfile.mkdtemp(prefix="learn_eff_"))
    results: dict = {"val_documents": val_names, "val_bytes": n_bytes, "runs": {}}
    try:
        if "a" in recipes and args.nanogpt_dir:
            ngdir = Path(args.nanogpt_dir)
            meta = write_nanogpt_data(work / "nanogpt_data", train_text, val_text)
            val_ids = np.fromfile(work / "nanogpt_data" / "val.bin", dtype=np.uint16)
            cpb = len(val_text) / n_bytes
            print(f"(a) nanoGPT: character vocabulary {meta['vocab_size']}; val {len(val_ids):,} characters; "
                  f"chars/bytes {cpb:.5f}", flush=True)
            for seed in seeds:
                t0 = time.time()
                r = run_nanogpt(ngdir, work / "nanogpt_data", work / f"nanogpt_{seed}", seed, args.threads, val_ids,
                                n_bytes, cpb, args.nanogpt_iters, args.nanogpt_score_every)
                results["runs"].setdefault("a", []).append(r)
                c, v = r["curve"][-1]
                print(f"(a) nanoGPT seed {seed}: val {v:.4f} bits/byte (its own 20-batch estimate "
                      f"{r['evals'][-1]['est_bpb']:.4f}) at {c:.1f} CPU s (start-up {r['cpu_startup']:.1f} s not "
                      f"counted; {time.time() - t0:.0f} s wall); curve "
                      + " ".join(f"{c:.0f}:{v:.3f}" for c, v in r["curve"]), flush=True)
        elif "a" in recipes:
            print("(a) skipped: no --nanogpt-dir / NANOGPT_DIR")

        if {"b", "c", "d"} & set(recipes):
            docs_dir = work / "train_docs"
            docs_dir.mkdir()
            for i, n in enumerate(train_names):
                (docs_dir / f"{i:04d}.txt").write_text(docs[n], encoding="utf-8")
            data = Path(args.bpe_dir) if args.bpe_dir else work / "bpe"
            if not (data / "meta.json").exists():  # else: prepared by an earlier run with the same split
                staging = work / "bpe_staging"
                prepare(PrepareConfig(inputs=[str(docs_dir)], out=str(staging), vocab_size=args.vocab_size,
                                      val_fraction=0.0, workers=1, recipe="none"), show_progress=False)
                if data.exists():
                    shutil.rmtree(data)
                shutil.move(str(staging), str(data))
            meta = load_meta(data)
            tok = Tokenizer.from_file(data / "tokenizer.json")
            val_tokens = np.asarray(tok.encode(val_text), dtype=np.int64)
            assert tok.decode(val_tokens.tolist()) == val_text, "the tokenizer does not round-trip the val text"
            rule = " (prepare's size rule)" if not args.vocab_size else ""
            print(f"(b, c, d) BPE vocabulary {meta['vocab_size']}{rule}; "
                  f"{meta['splits']['train']['tokens']:,} train tokens; val {len(val_tokens):,} tokens", flush=True)
            shape = dict(block_size=args.block, vocab_size=meta["vocab_size"])
            plan = [("b", f"{args.gpt2_preset} + AdamW", ModelConfig(preset=args.gpt2_preset, **shape), "adamw"),
                    ("c", f"{args.modern_preset} + Muon", ModelConfig(preset=args.modern_preset, **shape), "muon"),
                    ("d", f"{args.qwen3_preset} + Muon", ModelConfig(preset=args.qwen3_preset, **shape), "muon")]
            for key, name, mc, opt in plan:
                if key not in recipes:
                    continue
                for seed in seeds:
                    r = run_gptforge(name, mc, opt, data, work / f"run_{key}_{seed}", seed, args, val_tokens, n_bytes)
                    results["runs"].setdefault(key, []).append(r)
                    c, v = r["curve"][-1]
                    muon = f", muon_lr {r['muon_lr']:g}" if r["muon_lr"] else ""
                    print(f"({key}) {name} seed {seed}: val {v:.4f} bits/byte at {c:.1f} CPU s ({r['wall']:.0f} s wall; "
                          f"lr {r['lr']:g}{muon}, warmup "
                          f"{r['warmup']}); curve " + " ".join(f"{c:.0f}:{v:.3f}" for c, v in r["curve"]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average at end {' '.join(f'{x:.1f}' for x in os.getloadavg())}")

    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    report(results, args)


def report(results: dict, args) -> None:
    """Print the summary table and the two targets."""
    names = {"a": "(a) nanoGPT README CPU recipe", "b": f"(b) {args.gpt2_preset} + AdamW, size-aware defaults",
             "c": f"(c) {args.modern_preset} + Muon", "d": f"(d) {args.qwen3_preset} + Muon"}
    summ = {k: summarise(names[k], v) for k, v in results["runs"].items()}
    print("| recipe | final val bits/byte (mean ± sd; seeds) | CPU s per run (mean; seeds) |")
    print("|---|---|---|")
    for s in summ.values():
        print(f"| {s['recipe']} | {s['bpb_mean']:.4f} ± {s['bpb_sd']:.4f} ({', '.join(f'{x:.4f}' for x in s['final_bpb'])}) "
              f"| {s['cpu_mean']:.1f} ({', '.join(f'{x:.1f}' for x in s['final_cpu'])}) |")
    for k, runs in results["runs"].items():
        n = min(len(r["curve"]) for r in runs)
        points = []
        for i in range(n):
            cpus, vals = [r["curve"][i][0] for r in runs], [r["curve"][i][1] for r in runs]
            sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
            points.append(f"{statistics.mean(cpus):.0f} s {statistics.mean(vals):.3f}±{sd:.3f}")
        print(f"curve {k} (mean CPU s, mean val bits/byte ± sd over seeds): " + "; ".join(points))
    budget = min(r["curve"][-1][0] for runs in results["runs"].values() for r in runs)
    for k, runs in results["runs"].items():
        vals = [value_at(r["curve"], budget) for r in runs]
        sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
        print(f"at equal CPU seconds ({budget:.1f} s, the shortest run): {summ[k]['recipe']} "
              f"{statistics.mean(vals):.4f} ± {sd:.4f} ({', '.join(f'{x:.4f}' for x in vals)})")
    for fast, ref, bound in (("c", "b", 2 / 3), ("d", "b", 2 / 3), ("b", "a", 1 / 4)):
        if fast not in summ or ref not in summ:
            continue
        target, ref_cpu = summ[ref]["bpb_mean"], summ[ref]["cpu_mean"]
        inter = [interpolated_reach(r["curve"], target) for r in results["runs"][fast]]
        first = [first_reach(r["curve"], target) for r in results["runs"][fast]]
        mean_i = statistics.mean(inter)
        print(f"target {fast} vs {ref}: reach {ref}'s mean final {target:.4f} bits/byte; {ref}'s mean CPU s {ref_cpu:.1f}; "
              f"{fast} reaches it at {', '.join(f'{x:.1f}' for x in inter)} CPU s (interpolated; first evaluation at or "
              f"below: {', '.join(f'{x:.1f}' for x in first)}); mean {mean_i:.1f} = {mean_i / ref_cpu:.3f}x of {ref}'s "
              f"(target <= {bound:.3f}x): {'met' if mean_i / ref_cpu <= bound else 'NOT met'}")


if __name__ == "__main__":
    main()
