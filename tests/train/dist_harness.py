"""Run several training layouts inside one set of gloo CPU processes.

Starting processes costs seconds each on a small machine, so the distributed tests start the
workers once per world size; each worker joins one process group and runs `train()` for every
job in turn (every job builds its own device mesh on that group). Results come back as JSON.

Workers are forked from one forkserver that has imported torch and the trainer once for the whole
session (a spawned worker pays that import, 2-4 s, on each start); each worker takes the caller's
environment as it is at the call, as a spawned one would.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import socket
import time
import traceback
from pathlib import Path

import torch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: imported once by the forkserver the workers are forked from (before its first start).
PRELOAD = ["torch", "torch.distributed.checkpoint", "torch.distributed.fsdp", "torch.distributed.tensor.parallel",
           "torch.distributed.pipelining", "gptforge.train.run", "tests.train.dist_harness"]


def _run_job(job: dict, rank: int) -> dict:
    """One job on this rank: `train()` of its configs, or with "argv" that gptforge command line
    (as a process that `gptforge launch` started would run it; losses read from its metrics)."""
    from gptforge.config import ModelConfig, ParallelConfig, RunConfig, TrainConfig
    from gptforge.train.loggers import read_metrics
    from gptforge.train.run import train

    if job.get("argv"):
        from gptforge.cli import main

        rc = main(job["argv"])
        if rc != 0:
            raise RuntimeError(f"gptforge {' '.join(job['argv'])}: exit {rc}")
        rows = read_metrics(job["run_dir"]) if rank == 0 else []  # rank 0 writes them
        return {"loss": [r["loss"] for r in rows], "rows": rows}
    cfg = RunConfig(model=ModelConfig(**job["model"]), train=TrainConfig(**job["train"]),
                    parallel=ParallelConfig(**job["parallel"]))
    data = None
    if job.get("source"):  # "module:Class", built as Class(data_dir, **source_kwargs)
        import importlib

        mod, name = job["source"].split(":")
        data = getattr(importlib.import_module(mod), name)(job["data"], **job.get("source_kwargs", {}))
    res = train(cfg, job["data"], job["run_dir"], resume=job.get("resume", False), progress=False, data=data)
    return {"loss": [r["loss"] for r in res.history], "val_loss": [r.get("val_loss") for r in res.history],
            "rows": res.history}


def _worker(rank: int, world: int, port: int, jobs: list[dict], out: str, env: dict[str, str]) -> None:
    import torch.distributed as dist

    os.environ.clear()
    os.environ.update(env)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=90))
    results = {}
    for job in jobs:
        t0 = time.perf_counter()
        saved_env = dict(os.environ)
        os.environ.update(job.get("env_per_rank", {}).get(str(rank), {}))  # this rank's variables for this job
        try:
            results[job["name"]] = {**_run_job(job, rank), "seconds": time.perf_counter() - t0}
        except Exception:
            results[job["name"]] = {"error": traceback.format_exc()}
        os.environ.clear()
        os.environ.update(saved_env)
        dist.barrier()
        if job.get("copy_to") and rank == 0:  # keep this job's run folder as it is now, for later use
            shutil.copytree(job["run_dir"], job["copy_to"])
        dist.barrier()
    Path(out, f"rank{rank}.json").write_text(json.dumps(results, default=str))
    dist.destroy_process_group()


def run_layouts(world: int, jobs: list[dict], out_dir: Path, timeout_s: float = 240) -> dict:
    """Spawn `world` gloo processes that run `jobs` in order; return rank 0's results by job name
    ({"loss": [...], "val_loss": [...], "rows": [...]} or {"error": traceback}). A job is either
    configs (model, train, parallel dicts; data, run_dir, resume; source, source_kwargs) or "argv"
    (a gptforge command line; run_dir names the run folder it writes). A job with
    "copy_to" has its run folder copied there once it is done, before the next job runs; "env_per_rank"
    ({"1": {"VAR": "value"}}) sets environment variables on some ranks for that job only."""
    import multiprocessing

    import torch.multiprocessing as mp

    out_dir.mkdir(parents=True, exist_ok=True)
    multiprocessing.set_forkserver_preload(PRELOAD)  # no effect once the forkserver runs
    ctx = mp.start_processes(_worker, args=(world, free_port(), jobs, str(out_dir), dict(os.environ)), nprocs=world,
                             join=False, start_method="forkserver")
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            raise TimeoutError(f"distributed workers (world {world}) did not finish in {timeout_s} s")
    return json.loads((out_dir / "rank0.json").read_text())
