"""Throughput of `gptforge prepare` curation against datatrove, on all the distinct real text at hand.

Input: the shared data folder beside the repository (`../shared/data`, when present) and the
Python standard library's sources; nothing is copied to pad it (dedup would remove copies).
A tokenizer is trained once up front so that the figures are about curation, not BPE training.

Printed, for the `default` and `web` recipes and each worker count:
- curation seconds (reading, normalization, every step, global boilerplate and dedup; not
  tokenization), documents/s, MB/s and MB/s per worker (input UTF-8 bytes), with the default
  shard size; the CPU seconds the shards took in their processes (the same for any worker
  count when nothing is wasted; on a shared machine more telling than wall time) and the
  1-minute load average at the end (other jobs on the machine show there);
- tokenization tokens/s inside prepare;
- with datatrove installed (`pip install 'gptforge[bench]'`), the equivalent datatrove chain on
  one core in the same run, and the ratio of MB/s per core. datatrove's language filter is left
  out (it downloads a model at run time), so our web chain does more work than datatrove's
  (clean, boilerplate and language ID steps on top). datatrove's steps are called in-process
  with documents kept in memory between its dedup stages (no JSONL round trip), which favours
  datatrove;
- dedup agreement on identical input (our read + normalization output): exact-dedup drop sets
  (must be identical) and near-dedup keep decisions (fraction of documents on which the two
  agree; target >= 99%). MinHash with different hash functions decides pairs near the LSH
  threshold differently by chance, so two more figures separate chance from method: our banding
  and union-find run on datatrove's own signatures (must reproduce its clusters: 100%), and
  datatrove against itself with seed 2 instead of 1 (the noise floor of any independent hash);
- tokens/s of our encode path (`encode_documents`, one thread) against plain HF `tokenizers`
  `encode_batch` (one thread) with the same tokenizer file.

With `--executors local ray`, instead: the whole `prepare` (a given tokenizer, the first recipe)
of the same corpus under each executor, in MB/s of input: local with `--workers` processes, and
Ray on a head and one more node with one CPU each, started on loopback
(`tests.ray_cluster.LoopbackCluster`, Linux, root), the outputs compared by SHA-256, and the CPU
seconds the per-shard tasks took in their processes. Both run on the same cores of this one
machine, so no speed-up is possible: the figure shows Ray's overhead (connecting, scheduling,
results through the file system) against the local pool's (spawning its workers inside the run;
Ray's start with the cluster, which is not counted), and on a shared machine the share of the
cores each side's processes get.

Usage: python bench/prepare_throughput.py [--workers 1 2] [--recipes default web] [--max-mb 25]
       [--repeat 2] [--no-datatrove]
       python bench/prepare_throughput.py --executors local ray --workers 2 --max-mb 5
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

# Measure the checkout this script lives in, not whichever gptforge the environment installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def corpus_files(max_mb: float) -> list[Path]:
    """Shared-data .txt/.md files (sorted), then the standard library's .py files, up to `max_mb` MB."""
    from gptforge.data.stdlib_corpus import stdlib_files

    shared = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
    files = sorted(p for p in shared.rglob("*") if p.is_file() and p.suffix in (".txt", ".md")) if shared.is_dir() else []
    files += stdlib_files()
    out, total = [], 0
    for f in files:
        size = f.stat().st_size
        if total + size > max_mb * 1e6:
            break
        out.append(f)
        total += size
    return out


def load_documents(files: list[Path]) -> list[dict]:
    """Our reader + NFC normalization output: the common input of both dedup implementations."""
    from gptforge.data.normalize import NormalizeStats, normalize_documents
    from gptforge.data.readers import ReadStats, read_documents

    return list(normalize_documents(read_documents([], ReadStats(quiet=True), "auto", files=files),
                                    NormalizeStats(), form="NFC"))


# --------------------------------------------------------------------------------------------
# datatrove side
# --------------------------------------------------------------------------------------------


def _dt_exact(docs: list, tmp: Path) -> list:
    """datatrove's three exact-dedup stages on one task; returns the surviving documents."""
    from datatrove.pipeline.dedup.exact_dedup import (
        ExactDedupConfig,
        ExactDedupFilter,
        ExactDedupSignature,
        ExactFindDedups,
    )

    def content(doc):
        return doc.text.encode("utf-8", "surrogatepass")  # xxhash 4 hashes bytes only

    cfg = ExactDedupConfig(content_getter=content)
    list(ExactDedupSignature(str(tmp / "ex_sigs"), cfg)(iter(docs), 0, 1) or [])
    list(ExactFindDedups(str(tmp / "ex_sigs"), str(tmp / "ex_dups"), cfg)(None, 0, 1) or [])
    return list(ExactDedupFilter(str(tmp / "ex_dups"), cfg)(iter(docs), 0, 1))


def _dt_minhash(docs: list, tmp: Path) -> list:
    """datatrove's four MinHash stages (FineWeb's 5-grams, 14 x 8) on one core; survivors."""
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )

    cfg = MinhashConfig(n_grams=5, num_buckets=14, hashes_per_bucket=8)
    list(MinhashDedupSignature(str(tmp / "mh_sigs"), cfg)(iter(docs), 0, 1) or [])
    buckets = MinhashDedupBuckets(str(tmp / "mh_sigs"), str(tmp / "mh_buckets"), config=cfg)
    for rank in range(cfg.num_buckets):  # one task per bucket, run one after another
        list(buckets(None, rank, cfg.num_buckets) or [])
    list(MinhashDedupCluster(str(tmp / "mh_buckets"), str(tmp / "mh_remove"), config=cfg,
                             save_cluster_id=True)(None, 0, 1) or [])
    return list(MinhashDedupFilter(str(tmp / "mh_remove"))(iter(docs), 0, 1))


def datatrove_chain(files: list[Path], recipe: str, tmp: Path) -> tuple[float, int]:
    """(seconds, documents kept) of datatrove's equivalent of our `recipe` on one core.

    default: PII formatter, exact dedup, MinHash dedup. web: C4, Gopher repetition, Gopher
    quality and FineWeb filters, then the same (no language filter: it downloads its model).
    """
    from datatrove.data import Document as DTDocument
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )
    from datatrove.pipeline.formatters import PIIFormatter

    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    t0 = time.perf_counter()
    docs = [DTDocument(text=f.read_bytes().decode("utf-8", "replace"), id=str(i)) for i, f in enumerate(files)]
    steps = []
    if recipe == "web":
        steps += [C4QualityFilter(filter_curly_bracket=False), GopherRepetitionFilter(), GopherQualityFilter(),
                  FineWebQualityFilter()]
    steps.append(PIIFormatter())
    data = iter(docs)
    for step in steps:
        data = step(data, 0, 1)
    kept = _dt_minhash(_dt_exact(list(data), tmp), tmp)
    return time.perf_counter() - t0, len(kept)


def dedup_agreement(docs: list[dict], tmp: Path) -> dict:
    """Our exact and near dedup against datatrove's on the same documents (drop decisions)."""
    import numpy as np
    from datatrove.data import Document as DTDocument

    from gptforge.data.dedup import (
        band_hashes,
        duplicate_mask,
        exact_hash,
        minhash_signatures,
    )

    texts = [d.text for d in docs]
    ours_exact, _ = duplicate_mask(exact=np.array([exact_hash(t) for t in texts], dtype=np.uint64))
    ours_near, _ = duplicate_mask(bands=band_hashes(minhash_signatures(texts)))
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    dt_docs = [DTDocument(text=t, id=str(i)) for i, t in enumerate(texts)]
    kept_exact = {int(d.id) for d in _dt_exact(dt_docs, tmp)}
    kept_near = {int(d.id) for d in _dt_minhash(dt_docs, tmp)}
    dt_exact = np.array([i not in kept_exact for i in range(len(texts))])
    dt_near = np.array([i not in kept_near for i in range(len(texts))])
    # datatrove keeps the root of a union-by-size tree, we keep each cluster's first document;
    # with our keep rule applied to datatrove's clusters the comparison is of the clusters.
    dt_near_first = np.zeros(len(texts), dtype=bool)
    pairs = np.frombuffer((tmp / "mh_remove" / "000000.clusters").read_bytes(), dtype="<u4").reshape(-1, 2) \
        if (tmp / "mh_remove" / "000000.clusters").exists() else np.zeros((0, 2), np.uint32)
    for cid in np.unique(pairs[:, 1]):
        members = np.sort(pairs[pairs[:, 1] == cid, 0])
        dt_near_first[members[1:]] = True
    # Two hash families never agree on every pair near the LSH threshold. To tell that apart from a
    # difference of method: (1) our banding + union-find on datatrove's own signatures must give
    # datatrove's clusters exactly; (2) datatrove against itself with another seed is the noise floor.
    sig1, sig2 = _dt_signatures(texts, seeds=(1, 2))
    on_dt1, _ = duplicate_mask(bands=band_hashes(sig1))
    on_dt2, _ = duplicate_mask(bands=band_hashes(sig2))
    return {"documents": len(texts), "exact_ours": int(ours_exact.sum()), "exact_datatrove": int(dt_exact.sum()),
            "exact_identical": bool((ours_exact == dt_exact).all()), "near_ours": int(ours_near.sum()),
            "near_datatrove": int(dt_near.sum()), "near_agreement": float((ours_near == dt_near).mean()),
            "near_agreement_same_keep_rule": float((ours_near == dt_near_first).mean()),
            "clusters_on_datatrove_signatures": float((on_dt1 == dt_near_first).mean()),
            "datatrove_seed_1_vs_2": float((on_dt1 == on_dt2).mean())}


def _dt_signatures(texts: list[str], seeds: tuple[int, ...]) -> list:
    """datatrove's MinHash signatures (its simplification, spaCy words, hashes) per seed, (N, 112) uint64.

    A document without shingles gets our empty-set signature (`EMPTY_MINHASH` everywhere).
    """
    import numpy as np
    from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupSignature

    from gptforge.data.dedup import EMPTY_MINHASH

    steps = [MinhashDedupSignature(str(Path(tempfile.gettempdir()) / "unused"), MinhashConfig(seed=s)) for s in seeds]
    shingles = [steps[0].get_shingles(t) for t in texts]
    out = []
    for step in steps:
        sig = np.full((len(texts), 14 * 8), EMPTY_MINHASH, dtype=np.uint64)
        for i, sh in enumerate(shingles):
            if sh.size:
                sig[i] = np.concatenate([np.asarray(b, dtype=np.uint64) for b in step.get_signature(sh)])
        out.append(sig)
    return out


# --------------------------------------------------------------------------------------------
# Tokenization
# --------------------------------------------------------------------------------------------


def encode_speed(tok_path: Path, texts: list[str]) -> dict:
    """tokens/s of our encode path and of plain HF `tokenizers` encode_batch, same file, 1 thread."""
    import numpy as np
    from tokenizers import Tokenizer as HFTokenizer

    from gptforge.data.prepare import encode_documents
    from gptforge.data.tokenizer import Tokenizer

    ours = Tokenizer.from_file(tok_path)
    hf = HFTokenizer.from_file(str(tok_path))
    t = time.perf_counter()
    ids, _, _ = encode_documents(ours, texts, np.dtype(np.uint16))
    ours_s = time.perf_counter() - t
    t = time.perf_counter()
    n_hf = sum(len(e.ids) for e in hf.encode_batch(texts, add_special_tokens=False))
    hf_s = time.perf_counter() - t
    n_ours = len(ids) - len(texts)  # one EOS per document
    return {"tokens": n_ours, "tokens_hf": n_hf, "ours_tokens_per_second": n_ours / ours_s,
            "hf_tokens_per_second": n_hf / hf_s}


# --------------------------------------------------------------------------------------------
# Executors: local processes against Ray
# --------------------------------------------------------------------------------------------


def _prepare_timed(files: list[Path], out: Path, tok: Path, recipe: str, workers: int, **extra) -> float:
    from gptforge.data.prepare import PrepareConfig, prepare

    t = time.perf_counter()
    prepare(PrepareConfig(inputs=[str(f) for f in files], out=str(out), tokenizer=str(tok), workers=workers,
                          recipe=recipe, **extra), show_progress=False)
    return time.perf_counter() - t


def _task_cpu(out: Path) -> float:
    """CPU seconds of the per-shard tasks in their processes (report.json's shard_cpu_seconds)."""
    import json

    throughput = json.loads((out / "report.json").read_text()).get("throughput", {})
    return sum(d.get("shard_cpu_seconds", 0.0) for d in throughput.values())


def ray_driver(address: str, out: Path, tok: Path, recipe: str, max_mb: float) -> None:
    """The Ray side, run in the cluster's network namespace: prints one JSON line of seconds."""
    import json

    import ray

    t = time.perf_counter()
    ray.init(address=address, logging_level=logging.WARNING)
    connect = time.perf_counter() - t
    try:
        seconds = _prepare_timed(corpus_files(max_mb), out, tok, recipe, 1, executor="ray", ray_address=address)
    finally:
        ray.shutdown()
    print(json.dumps({"connect_seconds": connect, "prepare_seconds": seconds}), flush=True)


def executor_comparison(args: argparse.Namespace) -> None:
    """local vs Ray MB/s of the whole prepare (module docstring, `--executors`)."""
    import json

    from machine import cpu_description

    from gptforge.data.tokenizer import train_bpe

    files = corpus_files(args.max_mb)
    mb = sum(f.stat().st_size for f in files) / 1e6
    recipe, workers = args.recipes[0], max(args.workers)
    print(f"machine: {cpu_description()}")
    print(f"corpus: {len(files)} files, {mb:.1f} MB; recipe {recipe}; a given 4096-token tokenizer")
    tmp = Path(tempfile.mkdtemp(prefix="gptforge-bench-"))
    try:
        tok = tmp / "tok.json"
        train_bpe((f.read_text(errors="replace") for f in files[:300]), vocab_size=4096).save(tok)
        print(f"{'executor':34} {'seconds':>8} {'MB/s':>7} {'task CPU s':>10} {'load':>5}")
        if "local" in args.executors:
            secs = _prepare_timed(files, tmp / "local", tok, recipe, workers)
            print(f"{f'local, {workers} worker processes':34} {secs:>8.1f} {mb / secs:>7.2f} "
                  f"{_task_cpu(tmp / 'local'):>10.1f} {os.getloadavg()[0]:>5.1f}", flush=True)
        if "ray" in args.executors:
            repo = Path(__file__).resolve().parents[1]
            from tests.ray_cluster import LoopbackCluster

            t = time.perf_counter()
            with LoopbackCluster() as cluster:
                started = time.perf_counter() - t
                r = cluster.run([sys.executable, __file__, "--ray-driver", cluster.address, "--out", str(tmp / "ray"),
                                 "--tokenizer", str(tok), "--recipes", recipe, "--max-mb", str(args.max_mb)],
                                timeout=3600, env={**os.environ, "PYTHONPATH": str(repo)})
            if r.returncode != 0:
                raise SystemExit(f"the Ray driver failed: {r.stderr[-3000:]}")
            got = json.loads(r.stdout.strip().splitlines()[-1])
            secs = got["prepare_seconds"]
            print(f"{'Ray, 2 local nodes x 1 CPU':34} {secs:>8.1f} {mb / secs:>7.2f} {_task_cpu(tmp / 'ray'):>10.1f} "
                  f"{os.getloadavg()[0]:>5.1f}  "
                  f"(cluster start {started:.1f} s and connect {got['connect_seconds']:.1f} s not included)", flush=True)
            if "local" in args.executors:
                from tests.data.ray_cases import comparable_hashes

                same = comparable_hashes(tmp / "local") == comparable_hashes(tmp / "ray")
                print(f"outputs identical (meta.json, tokenizer.json, .bin, report.json counts): {same}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--recipes", nargs="+", default=["default", "web"])
    ap.add_argument("--max-mb", type=float, default=25.0)
    ap.add_argument("--repeat", type=int, default=1, help="measure everything this many times (noisy machines)")
    ap.add_argument("--no-datatrove", action="store_true")
    ap.add_argument("--executors", nargs="+", choices=["local", "ray"], help="compare executors instead")
    ap.add_argument("--ray-driver", metavar="ADDRESS", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--tokenizer", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    logging.getLogger("gptforge.data").setLevel(logging.ERROR)
    if args.ray_driver:
        return ray_driver(args.ray_driver, args.out, args.tokenizer, args.recipes[0], args.max_mb)
    if args.executors:
        return executor_comparison(args)
    from gptforge.data.prepare import PrepareConfig, prepare
    from gptforge.data.tokenizer import train_bpe

    have_dt = False
    if not args.no_datatrove:
        try:
            import datatrove  # noqa: F401
            from loguru import logger as dt_logger

            dt_logger.remove()  # datatrove logs every stage at INFO
            have_dt = True
        except ImportError:
            print("datatrove not installed (pip install 'gptforge[bench]'): our figures only")

    files = corpus_files(args.max_mb)
    mb = sum(f.stat().st_size for f in files) / 1e6
    print(f"corpus: {len(files)} files, {mb:.1f} MB")
    tmp = Path(tempfile.mkdtemp(prefix="gptforge-bench-"))
    try:
        tok = train_bpe((f.read_text(errors="replace") for f in files[:300]), vocab_size=4096)
        tok.save(tmp / "tok.json")
        docs = load_documents(files)
        for rep in range(args.repeat):
            print(f"\n== run {rep + 1} of {args.repeat}")
            print(f"{'chain':18} {'workers':>7} {'docs/s':>8} {'MB/s':>7} {'MB/s/core':>9} {'curate s':>9} "
                  f"{'tok/s':>9} {'kept docs':>9} {'shard cpu':>10} {'load':>5}")
            per_core: dict[tuple[str, int], float] = {}
            for recipe in args.recipes:
                for w in args.workers:
                    r = prepare(PrepareConfig(inputs=[str(f) for f in files], out=str(tmp / f"o-{recipe}-{w}-{rep}"),
                                              tokenizer=str(tmp / "tok.json"), workers=w, recipe=recipe),
                                show_progress=False)
                    th = r.report["throughput"]
                    cur = sum(th.get(k, {}).get("seconds", 0.0) for k in ("count_lines", "curate", "dedup"))
                    per_core[(recipe, w)] = mb / cur / w
                    cpu = sum(th.get(k, {}).get("shard_cpu_seconds", 0.0) for k in ("count_lines", "curate"))
                    print(f"{'gptforge ' + recipe:18} {w:>7} {len(docs) / cur:>8.1f} {mb / cur:>7.2f} "
                          f"{mb / cur / w:>9.2f} {cur:>9.1f} {th['tokenize'].get('tokens_per_second', 0):>9.0f} "
                          f"{r.report['check']['documents_written']:>9} {cpu:>10.1f} {os.getloadavg()[0]:>5.1f}",
                          flush=True)
                if have_dt:
                    secs, kept = datatrove_chain(files, recipe, tmp / "dt")
                    dt = mb / secs
                    print(f"{'datatrove ' + recipe:18} {1:>7} {len(docs) / secs:>8.1f} {dt:>7.2f} {dt:>9.2f} "
                          f"{secs:>9.1f} {'':>9} {kept:>9}")
                    for w in args.workers:
                        print(f"  ratio gptforge {recipe} ({w} worker{'s' if w > 1 else ''}) / datatrove, "
                              f"MB/s per core: {per_core[(recipe, w)] / dt:.2f}x", flush=True)
            if have_dt:
                a = dedup_agreement(docs, tmp / "dt-agree")
                print(f"dedup on identical input ({a['documents']} documents): exact drops ours {a['exact_ours']}, "
                      f"datatrove {a['exact_datatrove']}, identical: {a['exact_identical']}; near drops ours "
                      f"{a['near_ours']}, datatrove {a['near_datatrove']}, keep decisions agree on "
                      f"{100 * a['near_agreement']:.2f}% of documents as kept, "
                      f"{100 * a['near_agreement_same_keep_rule']:.2f}% with the first of each datatrove cluster kept")
                print(f"  our banding and union-find on datatrove's signatures: "
                      f"{100 * a['clusters_on_datatrove_signatures']:.2f}% agreement (same keep rule); noise floor, "
                      f"datatrove seed 1 vs seed 2: {100 * a['datatrove_seed_1_vs_2']:.2f}%", flush=True)
            e = encode_speed(tmp / "tok.json", [d.text for d in docs])
            print(f"encode: ours {e['ours_tokens_per_second']:,.0f} tokens/s, HF tokenizers encode_batch "
                  f"{e['hf_tokens_per_second']:,.0f} tokens/s ({e['tokens']:,} vs {e['tokens_hf']:,} tokens)",
                  flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
