"""CPU seconds per MB of every phase of `gptforge prepare`, before and after, with datatrove's chain.

For each corpus (English, Chinese; the corpora of `bench/language_prepare.py`) and recipe, runs
the whole `prepare` (tokenizer trained in the run, vocabulary by `vocab_size_rule`, one worker so
that every phase runs in the measuring process) once per source tree: this checkout, and with
`--baseline DIR` an older one (e.g. `git archive main | tar -x -C DIR`), each in a child process of
its own, the two alternating in one run. Each phase is timed in CPU seconds of the process
(`time.process_time`: the Rust threads of tokenizers and rensa included), which on a shared
machine is fairer than wall time:

- read, normalize, each per-document step of the curation pass, the boilerplate key pass (its
  own read, normalize and earlier steps included), the curation pass's own writing (Arrow, split
  keys, dedup keys), each corpus step's decision (boilerplate, dedup);
- split; the tokenizer sample, counting and BPE training; encode (the tokenizer calls, and the
  rest of the phase: reading the curated shards, splitting, saving ids); write (shards, report).

Printed per corpus and recipe: a table of CPU s, CPU s/MB (input UTF-8 MB) and the after/before
ratio per phase, MB/s per core end to end and of encode and curation, whether the two trees
wrote the same bytes (SHA-256 of meta.json, tokenizer.json, every .bin, report.json without
timings, as `tests/data/test_prepare_golden.py` compares), and the 1-minute load average at the
end of each run. With datatrove installed (`pip install 'gptforge[bench]'`), its equivalent
chain on the same files, step by step, in the same run (as `bench/prepare_throughput.py` runs it:
PII formatter, exact and MinHash dedup, plus the C4, Gopher and FineWeb filters for `web`, no
language filter), and the per-core ratio of gptforge's curation to datatrove's.

With `--repeat N` each tree runs N times, alternating, and the medians are shown (a loaded
machine moves single figures by +-25%; the load varies during a run).

Usage: python bench/prepare_profile.py --zh DIR --en DIR [--baseline DIR] [--recipes default web]
       [--max-mb 4] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def corpus_files(root: Path, max_mb: float) -> list[Path]:
    """The .txt/.md files under `root` (sorted), up to `max_mb` MB in all."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".txt", ".md"))
    out, total = [], 0
    for f in files:
        if total + f.stat().st_size > max_mb * 1e6:
            break
        out.append(f)
        total += f.stat().st_size
    return out


# --------------------------------------------------------------------------------------------
# Child: one prepare, instrumented
# --------------------------------------------------------------------------------------------


class _Clock:
    """CPU seconds per phase name (`time.process_time`)."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = defaultdict(float)
        self.curating = False  # inside the curation pass (not a key pass)

    def timed_call(self, name: str, fn):
        def wrapper(*a, **k):
            c = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                self.cpu[name] += time.process_time() - c
        return wrapper

    def timed_iter(self, name: str, it):
        """`it`, with the CPU time of each of its steps added to `name` (inner generators included)."""
        while True:
            c = time.process_time()
            try:
                x = next(it)
            except StopIteration:
                self.cpu[name] += time.process_time() - c
                return
            self.cpu[name] += time.process_time() - c
            yield x


class _TimedStep:
    """A per-document step whose calls are timed under its name during the curation pass."""

    def __init__(self, step, clock: _Clock) -> None:
        self.__dict__["_step"], self.__dict__["_clock"] = step, clock

    def __call__(self, doc):
        c = time.process_time()
        out = self._step(doc)
        if self._clock.curating:
            self._clock.cpu[f"step {self._step.name}"] += time.process_time() - c
        return out

    def __getattr__(self, name):
        return getattr(self._step, name)


def child(args: argparse.Namespace) -> None:
    """Run one instrumented prepare from the source tree `args.src`; print one JSON line."""
    sys.path.insert(0, str(Path(args.src).resolve()))
    import gptforge.data.phases.curate as cur
    import gptforge.data.phases.encode as enc
    import gptforge.data.phases.tokenizer as tokph
    import gptforge.data.prepare as prep

    clock = _Clock()
    read_sources, normalize = cur._read_sources, cur.normalize_documents
    cur._read_sources = lambda *a, **k: clock.timed_iter("read", read_sources(*a, **k))
    cur.normalize_documents = lambda *a, **k: clock.timed_iter("read+normalize", normalize(*a, **k))
    chain_before = cur.chain_before
    cur.chain_before = lambda *a, **k: [_TimedStep(s, clock) for s in chain_before(*a, **k)]
    curate_task = cur.curate_task

    def curate_timed(task):
        clock.curating = True
        try:
            return clock.timed_call("curate pass", curate_task)(task)
        finally:
            clock.curating = False

    cur.curate_task = curate_timed

    def key_pass(task):
        saved = dict(clock.cpu)
        c = time.process_time()
        out = key_pass_task(task)
        clock.cpu.clear()
        clock.cpu.update(saved)  # its read/normalize/steps are counted in the key pass row only
        clock.cpu["boilerplate key pass"] += time.process_time() - c
        return out

    key_pass_task = cur.key_pass_task
    cur.key_pass_task = key_pass
    decided = cur._decided
    cur._decided = lambda step, *a, **k: clock.timed_call(f"decide {step.name}", decided)(step, *a, **k)
    prep.run_split = clock.timed_call("split", prep.run_split)
    tokph.run_sample = clock.timed_call("tokenizer sample", tokph.run_sample)
    tokph.train_bpe = clock.timed_call("BPE training", tokph.train_bpe)
    prep.run_tokenizer = clock.timed_call("tokenizer phase", prep.run_tokenizer)
    enc.encode_documents = clock.timed_call("encode: tokenizer calls", enc.encode_documents)
    prep.run_encode = clock.timed_call("encode phase", prep.run_encode)
    prep.run_write = clock.timed_call("write", prep.run_write)

    files = corpus_files(Path(args.input), args.max_mb)
    c0 = time.process_time()
    prep.prepare(prep.PrepareConfig(inputs=[str(f) for f in files], out=args.out, recipe=args.recipe,
                                    languages=args.languages, workers=1, val_fraction=0.05), show_progress=False)
    total = time.process_time() - c0
    report = json.loads((Path(args.out) / "report.json").read_text(encoding="utf-8"))
    print(json.dumps({"cpu": dict(clock.cpu), "total": total, "mb": report["inputs"]["input_bytes"] / 1e6,
                      "vocab": json.loads((Path(args.out) / "meta.json").read_text())["vocab_size"],
                      "load": os.getloadavg()[0]}))


def phase_rows(cpu: dict[str, float], total: float) -> dict[str, float]:
    """Exclusive CPU seconds per displayed phase, from the child's (nested) timers."""
    c = dict(cpu)
    steps = {k: v for k, v in c.items() if k.startswith("step ")}
    rows = {"read": c.get("read", 0.0), "normalize": c.get("read+normalize", 0.0) - c.get("read", 0.0)}
    rows.update(steps)
    rows["curate pass: Arrow, split keys, dedup keys"] = (c.get("curate pass", 0.0) - c.get("read+normalize", 0.0)
                                                         - sum(steps.values()))
    for k in sorted(c):
        if k.startswith("decide ") or k == "boilerplate key pass":
            rows[k] = c[k]
    rows["split"] = c.get("split", 0.0)
    rows["tokenizer sample"] = c.get("tokenizer sample", 0.0)
    rows["BPE training"] = c.get("BPE training", 0.0)
    rows["tokenizer: vocabulary size count"] = (c.get("tokenizer phase", 0.0) - c.get("tokenizer sample", 0.0)
                                                - c.get("BPE training", 0.0))
    rows["encode: tokenizer calls"] = c.get("encode: tokenizer calls", 0.0)
    rows["encode: read, split, save"] = c.get("encode phase", 0.0) - c.get("encode: tokenizer calls", 0.0)
    rows["write"] = c.get("write", 0.0)
    rows["other (plan, fingerprint, report)"] = total - sum(rows.values())
    return rows


# --------------------------------------------------------------------------------------------
# datatrove side, step by step
# --------------------------------------------------------------------------------------------


def datatrove_profile(files: list[Path], recipe: str, tok_path: Path) -> dict[str, float]:
    """CPU seconds per step of datatrove's equivalent chain (see the module docstring), one process."""
    from datatrove.data import Document as DTDocument
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )
    from datatrove.pipeline.formatters import PIIFormatter
    from prepare_throughput import _dt_exact, _dt_minhash
    from tokenizers import Tokenizer as HFTokenizer

    tmp = Path(tempfile.mkdtemp(prefix="gptforge-dt-"))
    cpu: dict[str, float] = {}
    try:
        c = time.process_time()
        docs = [DTDocument(text=f.read_bytes().decode("utf-8", "replace"), id=str(i)) for i, f in enumerate(files)]
        cpu["read"] = time.process_time() - c
        steps = [("PII formatter", PIIFormatter())]
        if recipe == "web":
            steps = [("C4 filter", C4QualityFilter(filter_curly_bracket=False)),
                     ("Gopher repetition", GopherRepetitionFilter()), ("Gopher quality", GopherQualityFilter()),
                     ("FineWeb filter", FineWebQualityFilter())] + steps
        for name, step in steps:
            c = time.process_time()
            docs = list(step(iter(docs), 0, 1))
            cpu[name] = time.process_time() - c
        c = time.process_time()
        docs = _dt_exact(docs, tmp)
        cpu["exact dedup (3 stages)"] = time.process_time() - c
        c = time.process_time()
        docs = _dt_minhash(docs, tmp)
        cpu["MinHash dedup (4 stages)"] = time.process_time() - c
        hf = HFTokenizer.from_file(str(tok_path))
        c = time.process_time()
        hf.encode_batch([d.text for d in docs], add_special_tokens=False)
        cpu["tokenize (HF encode_batch, as its DocumentTokenizer)"] = time.process_time() - c
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return cpu


# --------------------------------------------------------------------------------------------
# Parent
# --------------------------------------------------------------------------------------------


def median_run(runs: list[dict]) -> dict:
    """One run's figures from repeated runs: the median CPU seconds of each timer and of the total,
    the last run's load."""
    import statistics

    keys = sorted({k for r in runs for k in r["cpu"]})
    return {**runs[-1], "cpu": {k: statistics.median(r["cpu"].get(k, 0.0) for r in runs) for k in keys},
            "total": statistics.median(r["total"] for r in runs)}


def run_child(src: Path, corpus: Path, languages: list[str], recipe: str, max_mb: float, out: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", "--src", str(src), "--input", str(corpus), "--recipe", recipe,
           "--max-mb", str(max_mb), "--out", str(out), "--languages", *languages]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"prepare from {src} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zh", type=Path, help="folder of Chinese text (.txt)")
    ap.add_argument("--en", type=Path, help="folder of English text (.txt)")
    ap.add_argument("--baseline", type=Path, help="an older source tree to compare (e.g. main's)")
    ap.add_argument("--recipes", nargs="+", default=["default", "web"])
    ap.add_argument("--max-mb", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=1, help="runs per tree (medians are shown)")
    ap.add_argument("--no-datatrove", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--src", help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    ap.add_argument("--recipe", help=argparse.SUPPRESS)
    ap.add_argument("--languages", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    sys.path.insert(0, str(HERE.parent))
    sys.path.insert(0, str(HERE))
    from machine import cpu_description

    from tests.data.test_prepare_golden import output_hashes

    have_dt = False
    if not args.no_datatrove:
        try:
            import datatrove  # noqa: F401
            from loguru import logger as dt_logger

            dt_logger.remove()  # datatrove logs every stage at INFO
            have_dt = True
        except ImportError:
            print("datatrove not installed (pip install 'gptforge[bench]'): gptforge's figures only")
    print(cpu_description())
    trees = ([("before", args.baseline)] if args.baseline else []) + [("after", HERE.parent)]
    corpora = [(lang, path) for lang, path in (("en", args.en), ("zh", args.zh)) if path is not None]
    tmp = Path(tempfile.mkdtemp(prefix="gptforge-profile-"))
    try:
        for lang, corpus in corpora:
            files = corpus_files(corpus, args.max_mb)
            for recipe in args.recipes:
                runs: dict[str, list[dict]] = {name: [] for name, _ in trees}
                hashes: dict[str, list] = {}
                for _rep in range(args.repeat):  # the trees alternate, so that load changes hit both
                    for name, src in trees:
                        out = tmp / f"{lang}-{recipe}-{name}"
                        shutil.rmtree(out, ignore_errors=True)
                        runs[name].append(run_child(src, corpus, [lang], recipe, args.max_mb, out))
                        hashes.setdefault(name, []).append(output_hashes(out))
                res = {name: median_run(r) for name, r in runs.items()}
                first = res[trees[0][0]]
                mb = first["mb"]
                print(f"\n### {lang}, recipe {recipe}: {len(files)} files, {mb:.2f} MB, vocabulary {first['vocab']}, "
                      f"load " + ", ".join(f"{n} {r['load']:.1f}" for n, r in res.items()))
                rows = {n: phase_rows(r["cpu"], r["total"]) for n, r in res.items()}
                head = " | ".join(f"{n} CPU s | {n} s/MB" for n, _ in trees)
                print(f"| phase | {head} |" + (" after/before |" if len(trees) > 1 else ""))
                print("|---|" + "---:|" * (2 * len(trees) + (len(trees) > 1)))
                for phase in rows[trees[-1][0]]:
                    cells = " | ".join(f"{rows[n].get(phase, 0.0):.2f} | {rows[n].get(phase, 0.0) / mb:.3f}"
                                       for n, _ in trees)
                    ratio = ""
                    if len(trees) > 1:
                        b, a = rows["before"].get(phase, 0.0), rows["after"].get(phase, 0.0)
                        ratio = f" {b / a:.2f}x faster |" if a > 0.005 and b > 0.005 else " |"
                    print(f"| {phase} | {cells} |{ratio}")
                for n, r in res.items():
                    rw = rows[n]
                    curate = sum(v for k, v in rw.items() if k in ("read", "normalize") or k.startswith(("step ",
                                 "decide ", "curate pass", "boilerplate")))
                    print(f"{n}: total {r['total']:.1f} CPU s = {mb / r['total']:.2f} MB/s per core end to end; "
                          f"curation {mb / curate:.2f} MB/s per core; encode phase "
                          f"{mb / (rw['encode: tokenizer calls'] + rw['encode: read, split, save']):.2f} MB/s per core, "
                          f"its tokenizer calls {mb / rw['encode: tokenizer calls']:.2f} MB/s per core", flush=True)
                if len(trees) > 1:
                    b, a = res["before"]["total"], res["after"]["total"]
                    print(f"end to end after/before: {b / a:.2f}x; encode tokenizer calls "
                          f"{rows['before']['encode: tokenizer calls'] / rows['after']['encode: tokenizer calls']:.2f}x;"
                          f" outputs byte-identical: {hashes['before'] == hashes['after']}")
                if have_dt:
                    dt = datatrove_profile(files, recipe, tmp / f"{lang}-{recipe}-after" / "tokenizer.json")
                    dt_total = sum(dt.values())
                    print("| datatrove step | CPU s | s/MB |\n|---|---:|---:|")
                    for k, v in dt.items():
                        print(f"| {k} | {v:.2f} | {v / mb:.3f} |")
                    dt_curate = dt_total - dt["tokenize (HF encode_batch, as its DocumentTokenizer)"]
                    rw = rows["after"]
                    ours = sum(v for k, v in rw.items() if k in ("read", "normalize") or k.startswith(
                        ("step ", "decide ", "curate pass", "boilerplate")))
                    print(f"datatrove curation {mb / dt_curate:.2f} MB/s per core; gptforge after / datatrove per "
                          f"core: {dt_curate / ours:.2f}x (load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
