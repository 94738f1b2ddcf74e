"""Checkpoint-resume matrix (issue 15, item 12): every data-parallel layout at 1, 2 and 4 ranks,
saved at step 3 and resumed at the same and at other process counts.

Layouts (gloo on the CPU, a 2-layer d_model-32 GPT in fp32, global batch 8 sequences of 32 tokens
at every size, 6 steps, checkpoint at step 3):

- ddp: DDP (parallel.dp_replicate N; one process: plain training);
- zero1: DDP + ZeroRedundancyOptimizer (parallel.dp_shard N, zero_stage 1);
- zero2 / zero3: FSDP2 (parallel.dp_shard N, zero_stage 2 / 3).

One rank runs in this process (ZeRO/FSDP2 get a one-process group, as without a launcher); 2 and
4 ranks run as gloo worker processes started once per size. Each resumed run is compared with the
uninterrupted run of the layout that saved: "bit-exact" when steps 4-6 give the same float losses,
else the largest relative difference (other process counts sum in another order: ~1e-7 is
expected), or the error. By default every layout resumes as itself at 1, 2 and 4 ranks; --cross
resumes every saved checkpoint as every layout.

    python bench/resume_matrix.py            # 4 layouts x 3 sizes saved, x 3 sizes resumed
    python bench/resume_matrix.py --cross    # x every layout at every size (144 resumes)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SIZES = (1, 2, 4)
KINDS = ("ddp", "zero1", "zero2", "zero3")
MODEL = dict(arch="gpt2", n_layer=2, n_head=2, d_model=32, block_size=32, dropout=0.0)
STEPS, SAVE_AT, GLOBAL_BATCH, MBS = 6, 3, 8, 2


def parallel_of(kind: str, n: int) -> dict:
    if kind == "ddp":
        return dict(dp_replicate=n) if n > 1 else {}
    return dict(dp_shard=n, zero_stage=int(kind[-1]))


def train_kw(n: int, **kw) -> dict:
    d = dict(max_steps=STEPS, micro_batch_size=MBS, gradient_accumulation_steps=GLOBAL_BATCH // (MBS * n),
             precision="fp32", lr=3e-3, warmup_steps=2, eval_interval=0, checkpoint_interval=0, tensorboard=False, seed=7,
             grad_clip=0.5)
    d.update(kw)
    return d


def run_job(job: dict) -> dict:
    from gptforge.config import ModelConfig, ParallelConfig, RunConfig, TrainConfig
    from gptforge.train.run import train

    t0 = time.perf_counter()
    try:
        cfg = RunConfig(model=ModelConfig(**MODEL), train=TrainConfig(**job["train"]),
                        parallel=ParallelConfig(**job["parallel"]))
        res = train(cfg, job["data"], job["run_dir"], resume=job.get("resume", False), progress=False)
        return {"loss": [r["loss"] for r in res.history], "seconds": time.perf_counter() - t0}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}",
                "traceback": traceback.format_exc()}


def _worker(rank: int, world: int, port: int, jobs: list[dict], out: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    results = {}
    for job in jobs:
        results[job["name"]] = run_job(job)
        # Written before the barrier: a rank that failed alone leaves the others in a collective
        # that gloo may abort, and its error must still come back.
        Path(out, f"rank{rank}.json").write_text(json.dumps(results))
        dist.barrier()
        if job.get("copy_to") and rank == 0:
            shutil.copytree(job["run_dir"], job["copy_to"])
        dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(world: int, jobs: list[dict], out: Path) -> dict:
    import torch.multiprocessing as mp

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    try:
        mp.spawn(_worker, args=(world, _free_port(), jobs, str(out)), nprocs=world)
    except Exception as e:  # a rank that died takes the set down; what finished is on disk
        print(f"  worker set of {world} failed: {type(e).__name__}: {str(e).strip().splitlines()[-1][:160]}",
              flush=True)
    got = {}
    for r in range(world):  # a job counts as failed when any rank reports an error
        f = out / f"rank{r}.json"
        for name, res in (json.loads(f.read_text()) if f.exists() else {}).items():
            if r == 0 or "error" in res:
                got.setdefault(name, res)
                if "error" in res:
                    got[name] = res
    return got


def _reset(job: dict) -> None:
    """Put a job's folders back as they were before a failed attempt."""
    shutil.rmtree(job["run_dir"], ignore_errors=True)
    if job.get("copy_to"):
        shutil.rmtree(job["copy_to"], ignore_errors=True)
    if job.get("fresh_from"):
        shutil.copytree(job["fresh_from"], job["run_dir"])


def run_set(world: int, jobs: list[dict], out: Path) -> dict:
    """Run `jobs` on `world` ranks (in this process when world is 1); a job a failed set did not
    finish is run again alone, so one failure does not hide the others."""
    if world == 1:
        return {job["name"]: run_job(job) for job in jobs}
    got = _spawn(world, jobs, out)
    for i, job in enumerate(jobs):
        if job["name"] not in got:
            _reset(job)
            got.update(_spawn(world, [job], out.with_name(f"{out.name}_{i}")))
            if job["name"] not in got:
                got[job["name"]] = {"error": "the worker set died (see the log above)"}
    return got


def compare(got: dict, want: list[float]) -> str:
    if "error" in got:
        return f"FAIL {got['error']}"
    if len(got["loss"]) != len(want):
        return f"FAIL {len(got['loss'])} steps, expected {len(want)}"
    if got["loss"] == want:
        return "bit-exact"
    rel = max(abs(a - b) / abs(b) for a, b in zip(got["loss"], want, strict=True))
    return f"{rel:.1e}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cross", action="store_true", help="resume every checkpoint as every layout")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = ap.parse_args(argv)

    import torch

    from gptforge.data.prepare import PrepareConfig, prepare
    from gptforge.data.stdlib_corpus import stdlib_files

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="resume_matrix_"))
    t_start = time.perf_counter()
    files = stdlib_files()
    data = tmp / "data"
    prepare(PrepareConfig(inputs=[str(p) for p in files[:: max(1, len(files) // 40)]], out=str(data),
                          vocab_size=384, val_fraction=0.1, workers=1), show_progress=False)

    layouts = [(k, n) for n in SIZES for k in KINDS]
    full, saved = {}, {}
    for n in SIZES:  # uninterrupted runs and step-3 checkpoints
        jobs = []
        for k in KINDS:
            name = f"{k}@{n}"
            jobs.append(dict(name=f"full {name}", train=train_kw(n), parallel=parallel_of(k, n), data=str(data),
                             run_dir=str(tmp / f"full_{k}_{n}")))
            jobs.append(dict(name=f"save {name}", train=train_kw(n, stop_at_step=SAVE_AT),
                             parallel=parallel_of(k, n), data=str(data), run_dir=str(tmp / f"save_{k}_{n}"),
                             copy_to=str(tmp / f"saved_{k}_{n}")))
        t0 = time.perf_counter()
        res = run_set(n, jobs, tmp / f"out_save_{n}")
        if n == 1:  # in this process the copy is made here
            for k in KINDS:
                shutil.copytree(tmp / f"save_{k}_{n}", tmp / f"saved_{k}_{n}")
        print(f"{n} rank(s): uninterrupted and saving runs in {time.perf_counter() - t0:.0f} s", flush=True)
        for k in KINDS:
            full[(k, n)] = res[f"full {k}@{n}"]
            saved[(k, n)] = res[f"save {k}@{n}"]

    cells: dict[tuple, str] = {}
    errors: dict[str, tuple[str, str]] = {}  # first traceback of each distinct error
    for m in SIZES:  # resumes onto m ranks
        jobs = []
        for (k, n) in layouts:
            if "error" in saved[(k, n)] or "error" in full[(k, n)]:
                continue
            for k2 in (KINDS if args.cross else (k,)):
                run = tmp / f"resume_{k}_{n}_as_{k2}_{m}"
                shutil.copytree(tmp / f"saved_{k}_{n}", run)
                jobs.append(dict(name=f"{k}@{n} -> {k2}@{m}", train=train_kw(m), parallel=parallel_of(k2, m),
                                 data=str(data), run_dir=str(run), resume=True, key=((k, n), (k2, m)),
                                 fresh_from=str(tmp / f"saved_{k}_{n}")))
        t0 = time.perf_counter()
        res = run_set(m, jobs, tmp / f"out_resume_{m}")
        print(f"{m} rank(s): {len(jobs)} resumes in {time.perf_counter() - t0:.0f} s", flush=True)
        for job in jobs:
            (src, dst) = job["key"]
            cells[(src, dst)] = compare(res[job["name"]], full[src]["loss"][SAVE_AT:])
            if "traceback" in res[job["name"]]:
                errors.setdefault(res[job["name"]]["error"], (job["name"], res[job["name"]]["traceback"]))

    print()
    print(f"torch {torch.__version__}, gloo on the CPU; steps {SAVE_AT + 1}-{STEPS} after a resume at step {SAVE_AT} "
          f"vs the saving layout's uninterrupted run; {time.perf_counter() - t_start:.0f} s in all")
    print()
    cols = [(k2, m) for m in SIZES for k2 in KINDS] if args.cross else [(None, m) for m in SIZES]
    head = [f"{k2}@{m}" if k2 else f"resumed on {m}" for k2, m in cols]
    print("| saved by | " + " | ".join(head) + " |")
    print("|---|" + "---|" * len(cols))
    failures = 0
    for (k, n) in layouts:
        row = []
        for k2, m in cols:
            src, dst = (k, n), (k2 or k, m)
            if "error" in full[src] or "error" in saved[src]:
                bad = full[src] if "error" in full[src] else saved[src]
                cell = f"FAIL saving: {bad['error']}"
            else:
                cell = cells[(src, dst)]
            failures += cell.startswith("FAIL")
            row.append(cell)
        print(f"| {k}@{n} | " + " | ".join(row) + " |")
    for src, r in list(full.items()) + list(saved.items()):
        if "traceback" in r:
            print(f"\n{src}:\n{r['traceback']}")
    for name, tb in errors.values():
        print(f"\n{name}:\n{tb}")
    if args.keep:
        print(f"\nfolders kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
