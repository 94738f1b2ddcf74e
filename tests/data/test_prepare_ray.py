"""`gptforge prepare --executor ray` on a local two-node cluster: the same bytes as the local
executor on every built-in recipe, resume after the driver is killed, retried worker faults,
a task that dies on every attempt, a work folder the nodes cannot see, Ray missing.

One cluster per module (`tests.ray_cluster.LoopbackCluster`: a head and one more node with one
CPU each, on 127.0.0.2/3 in a network namespace of its own, stopped by the pids it started); the
drivers run in its namespace. The module skips, with the reason, where the cluster cannot start
(no Ray, no Linux namespaces, not root). The corpus is the golden test's small generated one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.data.ray_cases import comparable_hashes
from tests.data.test_prepare_golden import CASES, corpus_dir, run_case

REPO = Path(__file__).resolve().parents[2]
#: one driver runs every case; a loaded 2-core machine needs minutes for the first Ray workers.
DRIVER_TIMEOUT = 600


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'gptforge[ray]')")
    pytest.importorskip("psutil", reason="psutil is not installed")
    if not sys.platform.startswith("linux"):
        pytest.skip("the loopback cluster needs Linux network namespaces")
    from tests.ray_cluster import ClusterUnavailable, LoopbackCluster

    try:
        c = LoopbackCluster()
    except ClusterUnavailable as e:
        pytest.skip(f"a local Ray cluster cannot start here: {e}")
    yield c
    c.close()


@pytest.fixture(scope="module")
def local_hashes(corpus_dir):
    """{case: output hashes} of the local executor, computed on first use."""
    found: dict[str, dict[str, str]] = {}

    def get(case: str) -> dict[str, str]:
        if case not in found:
            cwd = os.getcwd()
            os.chdir(corpus_dir)
            try:
                run_case(case, out=f"local-{case}")
                found[case] = comparable_hashes(Path(corpus_dir) / f"local-{case}")
            finally:
                os.chdir(cwd)
        return found[case]

    return get


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GPTFORGE_FAULT_TASK"}
    return {**env, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0", **extra}


def _prepare_args(cluster, out: str, recipe: str, *extra: str) -> list[str]:
    """The CLI of `run_case("recipe-RECIPE")` (same options) with --executor ray."""
    return [sys.executable, "-m", "gptforge.cli", "prepare", "corpus", "--out", out, "--recipe", recipe,
            "--vocab-size", "320", "--workers", "1", "--shard-bytes", "4096", "--no-progress",
            "--executor", "ray", "--ray-address", cluster.address, *extra]


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = DRIVER_TIMEOUT) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the driver ended (rc {proc.returncode}) before {path} appeared: "
                                 f"{proc.stderr.read()[-3000:] if proc.stderr else ''}")
        if time.monotonic() > end:
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.2)


def test_missing_ray_is_one_line_error(tmp_path):
    """Without Ray, `--executor ray` ends with one line naming the extra to install."""
    shadow = tmp_path / "shadow" / "ray"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named ray (shadowed by the test)')\n")
    (tmp_path / "a.txt").write_text("Some words to read. " * 40)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "shadow"), str(REPO)])}
    r = subprocess.run([sys.executable, "-m", "gptforge.cli", "prepare", str(tmp_path / "a.txt"), "--out",
                        str(tmp_path / "out"), "--executor", "ray", "--no-progress"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("gptforge prepare: error: --executor ray needs Ray: pip install 'gptforge[ray]'"), r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_byte_identical_to_local_on_every_case(cluster, corpus_dir, local_hashes):
    """Every built-in recipe, one file split by position, a file read in byte ranges: the same bytes."""
    cases = sorted(CASES)
    r = cluster.run([sys.executable, "-m", "tests.data.ray_cases", cluster.address, *cases], cwd=corpus_dir,
                    env=_env(), timeout=DRIVER_TIMEOUT)
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["nodes"] == ["127.0.0.2", "127.0.0.3"]
    assert got["curated_on"] == ["127.0.0.2", "127.0.0.3"], "the shards did not run on both nodes"
    for case in cases:
        assert got["hashes"][case] == local_hashes(case), case


def test_driver_killed_then_rerun_resumes(cluster, corpus_dir, local_hashes):
    """kill -9 of the driver while a task runs: Ray ends its workers; the rerun skips finished shards."""
    import psutil

    work = corpus_dir / ".k-out.work"
    stall = work / ".fault-tokenize-00000"
    proc = cluster.popen(_prepare_args(cluster, "k-out", "default"), cwd=corpus_dir,
                         env=_env(GPTFORGE_FAULT_TASK="tokenize:0:stall"), stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(stall, proc)
        time.sleep(0.5)  # the pid is written first
        worker = int(stall.read_text())
        assert (work / "curate" / "00000.json").exists()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    end = time.monotonic() + 120
    while psutil.pid_exists(worker) and psutil.Process(worker).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < end, f"Ray did not end the dead driver's worker {worker}"
        time.sleep(0.5)
    # A curate or tokenizer-sample task that ran again would die on every attempt and fail the run.
    again = cluster.run(_prepare_args(cluster, "k-out", "default"), cwd=corpus_dir, timeout=DRIVER_TIMEOUT,
                        env=_env(GPTFORGE_FAULT_TASK="curate:0:always,tokenizer sample:0:always"))
    assert again.returncode == 0, again.stderr[-4000:]
    assert comparable_hashes(corpus_dir / "k-out") == local_hashes("recipe-default")
    assert not work.exists()


def test_worker_faults_are_retried_with_the_same_output(cluster, corpus_dir, local_hashes):
    """A worker killed in each per-shard phase (key pass, curate, tokenizer sample, tokenize)."""
    faults = "count lines:1,curate:1,tokenizer sample:0,tokenize:2"
    r = cluster.run(_prepare_args(cluster, "f-out", "web", "--keep-work"), cwd=corpus_dir, timeout=DRIVER_TIMEOUT,
                    env=_env(GPTFORGE_FAULT_TASK=faults))
    assert r.returncode == 0, r.stderr[-4000:]
    work = corpus_dir / ".f-out.work"
    for spec in faults.split(","):
        phase, shard = spec.split(":")
        marker = work / f".fault-{phase.replace(' ', '_')}-{int(shard):05d}"
        assert marker.exists(), f"the fault {spec} did not fire"
    assert comparable_hashes(corpus_dir / "f-out") == local_hashes("recipe-web")


def test_task_dying_on_every_attempt_names_shard_and_reason(cluster, corpus_dir):
    r = cluster.run(_prepare_args(cluster, "x-out", "none"), cwd=corpus_dir, timeout=DRIVER_TIMEOUT,
                    env=_env(GPTFORGE_FAULT_TASK="curate:2:always"))
    assert r.returncode == 1, r.stderr[-4000:]
    last = [line for line in r.stderr.splitlines() if line.strip()][-1]
    assert last.startswith("gptforge prepare: error: prepare --executor ray: curate of work shard 2 ("), last
    assert "failed on all 4 attempts: WorkerCrashedError" in last, last
    assert not (corpus_dir / "x-out").exists() and not (corpus_dir / ".x-out.work").exists()


def test_work_folder_the_nodes_cannot_see(cluster, corpus_dir, tmp_path):
    """The driver writes its work folder on a tmpfs only it mounts: a clear error naming a node."""
    private = tmp_path / "private"
    private.mkdir()
    r = cluster.run([*_prepare_args(cluster, str(private / "out"), "none")], cwd=corpus_dir, env=_env(),
                    timeout=DRIVER_TIMEOUT, private_folder=private)
    assert r.returncode == 1, r.stderr[-4000:]
    last = [line for line in r.stderr.splitlines() if line.strip()][-1]
    assert "gptforge prepare: error: Ray node 127.0.0." in last and "cannot see the work folder" in last, last
    assert "storage every node mounts at the same path" in last, last


def test_without_address_a_ray_instance_is_started_for_the_run(cluster, corpus_dir, local_hashes):
    """No --ray-address, no RAY_ADDRESS: Ray on this machine for the run (in the namespace: loopback)."""
    args = _prepare_args(cluster, "l-out", "none")
    args = args[:args.index("--ray-address")]
    r = cluster.run(args, cwd=corpus_dir, env={k: v for k, v in _env().items() if k != "RAY_ADDRESS"},
                    timeout=DRIVER_TIMEOUT)
    assert r.returncode == 0, r.stderr[-4000:]
    assert comparable_hashes(corpus_dir / "l-out") == local_hashes("recipe-none")


def test_an_address_where_no_cluster_answers(cluster, corpus_dir):
    r = cluster.run([*_prepare_args(cluster, "n-out", "none")[:-1], "127.0.0.9:1"], cwd=corpus_dir, env=_env(),
                    timeout=DRIVER_TIMEOUT)
    assert r.returncode == 1, r.stderr[-4000:]
    last = [line for line in r.stderr.splitlines() if line.strip()][-1]
    assert last.startswith("gptforge prepare: error: --ray-address 127.0.0.9:1: no Ray cluster answers there"), last


def test_nothing_listens_outside_loopback(cluster):
    """Every process the cluster started (nodes, workers, drivers still alive): loopback only."""
    from tests.ray_cluster import reaches_beyond_loopback

    listeners = cluster.listeners()
    assert any(name == "gcs_server" for _, name, _, _ in listeners), listeners
    outside = [entry for entry in listeners if reaches_beyond_loopback(entry[2], entry[0])]
    assert not outside, f"listening beyond loopback: {outside}"
