"""A Ray driver for tests: `python -m tests.data.ray_cases ADDRESS CASE...` in the golden corpus folder.

Connects to the cluster once (so every case's tasks reuse the same worker processes), runs each
case of `test_prepare_golden.CASES` with `--executor ray` and prints one JSON object: the alive
nodes with CPUs, and per case the SHA-256 of its outputs (`test_prepare_golden.output_hashes`).
"""

from __future__ import annotations

import json
import logging
import sys


def main(address: str, cases: list[str]) -> None:
    import ray
    from tests.data.test_prepare_golden import run_case

    ray.init(address=address, logging_level=logging.WARNING)
    try:
        nodes = [n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU")]
        hashes = {case: run_case(case, executor="ray", ray_address=address) for case in cases}
    finally:
        ray.shutdown()
    print(json.dumps({"nodes": sorted(nodes), "hashes": hashes}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
