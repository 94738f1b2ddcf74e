"""A Ray driver for tests: `python -m tests.data.ray_cases ADDRESS CASE...` in the golden corpus folder.

Connects to the cluster once (so every case's tasks reuse the same worker processes), runs each
case of `test_prepare_golden.CASES` with `--executor ray` into `ray-CASE` and prints one JSON
object: the alive nodes with CPUs, the nodes whose workers curated shards, and per case
`comparable_hashes` of its output.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from pathlib import Path

from tests.data.test_prepare_golden import output_hashes, report_without_timings, run_case

#: report.json fields that say how a run went, not what it wrote: the worker count asked for,
#: whether it resumed, and per phase the number of distinct worker processes.
RUN_FIELDS = ("workers", "resumed")


def comparable_hashes(out: Path) -> dict[str, str]:
    """`output_hashes`, with report.json also without `RUN_FIELDS` and each phase's `processes`:
    what must be byte-identical between executors (meta.json, tokenizer.json, .bin, report counts)."""
    hashes = output_hashes(out)
    report = json.loads(report_without_timings((out / "report.json").read_bytes()))
    for key in RUN_FIELDS:
        report.pop(key, None)
    report["throughput"] = {phase: {k: v for k, v in d.items() if k != "processes"}
                            for phase, d in report.get("throughput", {}).items()}
    hashes["report.json"] = hashlib.sha256(json.dumps(report, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    return hashes


def node_of(pid: int) -> str | None:
    """The node address of the raylet that started worker process `pid` (None: not found)."""
    import psutil

    try:
        p = psutil.Process(pid)
        while p is not None and p.name() != "raylet":
            p = p.parent()
        if p is None:
            return None
        return next((a.split("=", 1)[1] for a in p.cmdline() if a.startswith("--node_ip_address=")), None)
    except psutil.Error:
        return None


def main(address: str, cases: list[str]) -> None:
    import ray

    ray.init(address=address, logging_level=logging.WARNING)
    try:
        nodes = [n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU")]
        hashes, curated_on = {}, set()
        for case in cases:
            run_case(case, out=f"ray-{case}", executor="ray", ray_address=address, keep_work=True)
            hashes[case] = comparable_hashes(Path(f"ray-{case}"))
            # While this driver lives its workers do: each curate shard's pid -> its node.
            for stats in Path(f".ray-{case}.work/curate").glob("*.json"):
                curated_on.add(node_of(json.loads(stats.read_text())["pid"]))
    finally:
        ray.shutdown()
    print(json.dumps({"nodes": sorted(nodes), "curated_on": sorted(map(str, curated_on)), "hashes": hashes}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
