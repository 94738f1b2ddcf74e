"""Does the quality step pay? DCLM's experiment (Li et al. 2024, section 4.4) at CPU size.

Wanted text: Shakespeare's plays (../shared/data/openshakespeare/shakespeare, or --wanted), cut into
documents of about 3,000 characters at blank lines; every document goes by the hash of its text
to the reference set (20%), the input (40%) or the held-out evaluation text (40%). Other text:
docstrings of the Python standard library (fluent English of another register, about twice the
wanted input's size). Both pass the rule recipe (`default`: repair, PII, dedup).

Three shard folders from the same input and one tokenizer (trained on variant (a)):
(a) the input as read (recipe none); (b) the rule recipe (default); (c) the rule recipe, then
the quality classifier trained on the reference set, keeping --keep of the documents.
The same model (--preset) is trained on each for the same number of tokens (--steps x the batch,
repeating data as needed), for each --seeds; the figure is bits per byte on the held-out wanted
text (`gptforge evaluate --text`). Also printed: the classifier's held-out accuracy and AUC, the
share of wanted documents among those kept, and the quality step's CPU seconds per input MB.

Usage: python bench/quality_filter.py [--steps 300] [--seeds 0 1 2] [--keep 0.15] [--preset gpt2-nano]
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import pkgutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from machine import cpu_description  # noqa: E402

DOC_CHARS = 3000


def chunks(text: str, size: int = DOC_CHARS) -> list[str]:
    """`text` cut at blank lines into pieces of about `size` characters."""
    out, cur = [], []
    n = 0
    for para in text.replace("\r\n", "\n").split("\n\n"):
        cur.append(para)
        n += len(para)
        if n >= size:
            out.append("\n\n".join(cur).strip())
            cur, n = [], 0
    if cur and n > size // 3:
        out.append("\n\n".join(cur).strip())
    return [c for c in out if c]


def docstrings(limit_chars: int) -> list[str]:
    """Docstrings (>= 400 characters) of standard-library modules and their members, in a fixed order."""
    import warnings

    warnings.simplefilter("ignore")
    found: dict[str, None] = {}
    total = 0
    skip = ("test", "idlelib", "tkinter", "turtle", "antigravity", "this", "lib2to3", "ensurepip", "pydoc_data")
    for mod in sorted(pkgutil.iter_modules(), key=lambda m: m.name):
        if mod.name.startswith(("_",) + skip) or not getattr(mod.module_finder, "path", "").endswith("python3.11"):
            continue
        try:
            m = __import__(mod.name)
        except Exception:  # noqa: BLE001 - a module that does not import here is skipped
            continue
        for _, obj in [(None, m), *inspect.getmembers(m)]:
            try:
                d = inspect.getdoc(obj)
            except Exception:  # noqa: BLE001
                continue
            if d and len(d) >= 400 and d not in found:
                found[d] = None
                total += len(d)
        if total >= limit_chars:
            break
    return list(found)


def bucket(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % 5


def write_docs(folder: Path, docs: list[str], prefix: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, d in enumerate(docs):
        (folder / f"{prefix}_{i:05d}.txt").write_text(d, encoding="utf-8")


def gptforge(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "gptforge.cli", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"gptforge {' '.join(args)} failed:\n{r.stderr[-3000:]}")
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wanted", default=str(REPO.parent / "shared" / "data" / "openshakespeare" / "shakespeare"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--keep", type=float, default=0.15)
    ap.add_argument("--preset", default="gpt2-nano")
    ap.add_argument("--micro-batch-size", type=int, default=16)
    ap.add_argument("--held-out-documents", type=int, default=100, help="wanted documents scored (about 3,000 characters each)")
    args = ap.parse_args()
    wanted_dir = Path(args.wanted)
    if not wanted_dir.is_dir():
        raise SystemExit(f"--wanted {wanted_dir}: not a folder (the plays of ../shared/data/openshakespeare)")
    plays = [chunks(p.read_text(encoding="utf-8", errors="replace")) for p in sorted(wanted_dir.glob("*.txt"))]
    wanted = [c for cs in plays for c in cs]
    ref = [d for d in wanted if bucket(d) == 0]
    held = [d for d in wanted if bucket(d) in (3, 4)][:args.held_out_documents]
    other = [c for d in docstrings(10**8) for c in (chunks(d) or [d])]
    # The wanted text is a quarter of the input: as many characters as a third of the other text.
    inp, budget = [], sum(map(len, other)) // 3
    for d in (d for d in wanted if bucket(d) in (1, 2)):
        if budget <= 0:
            break
        inp.append(d)
        budget -= len(d)
    print(f"## quality_filter: {cpu_description()}")
    print(f"wanted: {len(wanted)} documents ({len(ref)} reference, {len(inp)} in the input, {len(held)} held out); "
          f"other: {len(other)} docstring documents; {sum(map(len, inp)) / 1e6:.2f} + "
          f"{sum(map(len, other)) / 1e6:.2f} M characters of input")
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        write_docs(t / "input", inp, "wanted")
        write_docs(t / "input", other, "other")
        write_docs(t / "reference", ref, "ref")
        (t / "heldout.txt").write_text("\n\n".join(held), encoding="utf-8")
        common = ["--val-fraction", "0.02", "--workers", "2", "--quiet"]
        gptforge("prepare", str(t / "input"), "--out", str(t / "a"), "--recipe", "none", "--vocab-size", "2048",
                 *common)
        tok = str(t / "a" / "tokenizer.json")
        gptforge("prepare", str(t / "input"), "--out", str(t / "b"), "--recipe", "default", "--tokenizer", tok, *common)
        c0 = time.process_time()
        gptforge("prepare", str(t / "input"), "--out", str(t / "c"), "--recipe", "default", "--tokenizer", tok,
                 "--quality-reference", str(t / "reference"), "--quality-keep", str(args.keep), *common)
        report = json.loads((t / "c" / "report.json").read_text())
        q = report["quality"]
        import pyarrow.parquet as pq

        rows = pq.read_table(t / "c" / "quality" / "scores.parquet").to_pylist()
        kept_wanted = sum(r["kept"] and "/wanted_" in r["id"] for r in rows) / max(1, sum(r["kept"] for r in rows))
        share_in = sum("/wanted_" in r["id"] for r in rows) / max(1, len(rows))
        tp = report["throughput"].get("quality_scoring", {})
        mb = report["inputs"]["input_bytes"] / 1e6
        print(f"classifier: held-out accuracy {q['model']['held_out_accuracy']:.3f}, AUC {q['model']['held_out_auc']:.3f} "
              f"on {q['model']['held_out_documents']} documents; wanted share {share_in:.1%} of the scored input, "
              f"{kept_wanted:.1%} of the kept ({q['kept']} of {q['scored']}); quality step "
              f"{tp.get('seconds', float('nan')):.1f} s wall; CPU: {q['train_cpu_seconds']:.1f} s training, "
              f"{tp.get('shard_cpu_seconds', 0.0):.1f} s scoring, "
              f"{(q['train_cpu_seconds'] + tp.get('shard_cpu_seconds', 0.0)) / mb:.2f} CPU s per input MB, "
              f"load {os.getloadavg()[0]:.1f}; driver CPU {time.process_time() - c0:.1f} s")
        results: dict[str, list[float]] = {}
        for variant in ("a", "b", "c"):
            for seed in args.seeds:
                run = t / f"run-{variant}-{seed}"
                gptforge("pretrain", "--data", str(t / variant), "--out", str(run), "--model.preset", args.preset,
                         "--train.max_steps", str(args.steps), "--train.micro_batch_size", str(args.micro_batch_size),
                         "--train.seed", str(seed), "--train.eval_interval", "0", "--train.report", "false")
                gptforge("evaluate", str(run), "--text", str(t / "heldout.txt"), "--out", str(run / "heldout.json"),
                         "--quiet")
                bpb = json.loads((run / "heldout.json").read_text())["bits_per_byte"]
                results.setdefault(variant, []).append(bpb)
                print(f"  ({variant}) seed {seed}: {bpb:.4f} bits per byte (load {os.getloadavg()[0]:.1f})", flush=True)
        names = {"a": "input as read", "b": "rule recipe (default)", "c": f"rules + classifier top {args.keep:.0%}"}
        print(f"\n| data | tokens in train split | held-out wanted bits per byte, mean over seeds {args.seeds} | per seed |")
        print("|---|---:|---:|---|")
        for v, bpbs in results.items():
            meta = json.loads((t / v / "meta.json").read_text())
            print(f"| ({v}) {names[v]} | {meta['splits']['train']['tokens']:,} | {statistics.mean(bpbs):.4f} | "
                  f"{', '.join(f'{b:.4f}' for b in bpbs)} |")


if __name__ == "__main__":
    main()
