"""The scripts `gptforge slurm` writes, run by a real Slurm (tests/slurm_cluster.py on this machine).

A 1-node CPU job (2 processes under torchrun) trains a tiny model to completion: sbatch's exit
status, the job's record in slurmctld and the run folder are checked. Scripts for 2 and 8 nodes,
CPU and GPU mode, pass `sbatch --test-only` against the declared nodes n[1-8] (8 GPUs each, as
GRES); asking for more than exists fails it. Skipped, with the reason, where Slurm cannot run.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from gptforge.cli import main as cli
from gptforge.runtime import checkpoint as ck
from gptforge.train.loggers import read_metrics
from tests.slurm_cluster import ClusterUnavailable, SlurmCluster, node_cpus, node_topology
from tests.train.dist_harness import free_port

TINY = ["--model.preset", "gpt2-nano", "--model.d_model", "32", "--model.block_size", "32",
        "--train.max_steps", "2", "--train.micro_batch_size", "2", "--train.eval_interval", "0",
        "--train.warmup_steps", "1", "--train.tensorboard", "false", "--train.compile", "false", "--quiet"]
JOB_TIMEOUT_S = 400


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    try:
        c = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    except ClusterUnavailable as e:
        pytest.skip(f"no Slurm cluster: {e}")
    yield c
    c.stop()


def _script(tmp_path, name: str, slurm_args: list[str], command: list[str]):
    out = tmp_path / f"{name}.sbatch"
    assert cli(["slurm", *slurm_args, "--python", sys.executable, "--port", str(free_port()),
                "--time", "00:15:00", "--job-name", name, "--out", str(out), "--", *command]) == 0
    return out


@pytest.mark.slow
def test_one_node_cpu_job_trains(cluster, tiny_shards, tmp_path):
    run = tmp_path / "run"
    script = _script(tmp_path, "gptforge-test", ["--nodes", "1", "--gpus-per-node", "0", "--nproc-per-node", "2"],
                     ["pretrain", "--data", str(tiny_shards), "--out", str(run), *TINY])
    text = script.read_text()
    assert "#SBATCH --exclusive" in text and "gpus" not in text.lower()
    # sbatch hands the job this environment (--export=ALL): the interpreter's packages, one thread
    # per process and gloo on loopback.
    env = dict(cluster.env, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    proc = subprocess.run(["sbatch", "--wait", "--parsable", str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    job_id = proc.stdout.strip().split(";")[0]
    log = tmp_path / f"gptforge-test-{job_id}.out"
    job_log = log.read_text() if log.is_file() else "(no job output)"
    assert proc.returncode == 0, f"sbatch --wait: exit {proc.returncode}\n{proc.stderr}\n{job_log[-4000:]}"
    record = subprocess.run(["scontrol", "show", "job", job_id], env=cluster.env, capture_output=True, text=True).stdout
    assert "JobState=COMPLETED" in record and "ExitCode=0:0" in record, record
    assert "NodeList=n1" in record
    assert [r["step"] for r in read_metrics(run)] == [1, 2]
    ckpt = ck.find_checkpoint(run)
    assert ckpt.name == ck.step_dir_name(2) and len(list(ckpt.glob("*.distcp"))) == 2
    assert (run / "config.yaml").is_file()


@pytest.mark.parametrize("nodes", [2, 8])
@pytest.mark.parametrize("mode", ["cpu", "gpu"])
def test_multi_node_scripts_pass_test_only(cluster, tmp_path, mode, nodes):
    cpus = node_cpus(node_topology())
    per_node = ["--gpus-per-node", "0", "--nproc-per-node", "2"] if mode == "cpu" else \
        ["--gpus-per-node", "8", "--cpus-per-task", str(cpus)]
    script = _script(tmp_path, f"{mode}{nodes}", ["--nodes", str(nodes), *per_node],
                     ["pretrain", "--data", "DATA", "--out", "RUN"])
    assert ("#SBATCH --gpus-per-node=8" in script.read_text()) == (mode == "gpu")
    proc = subprocess.run(["sbatch", "--test-only", str(script)], cwd=tmp_path, env=cluster.env,
                          capture_output=True, text=True, timeout=60)
    want = "n[1-2]" if nodes == 2 else "n[1-8]"
    assert proc.returncode == 0 and re.search(r"to start at .* on nodes " + re.escape(want), proc.stderr), proc.stderr


def test_test_only_refuses_what_the_cluster_lacks(cluster, tmp_path):
    nine = _script(tmp_path, "nine", ["--nodes", "9", "--gpus-per-node", "0", "--nproc-per-node", "1"],
                   ["pretrain", "--data", "DATA", "--out", "RUN"])
    sixteen_gpus = _script(tmp_path, "gpu16", ["--nodes", "2", "--gpus-per-node", "16", "--cpus-per-task", "1"],
                           ["pretrain", "--data", "DATA", "--out", "RUN"])
    for script in (nine, sixteen_gpus):
        proc = subprocess.run(["sbatch", "--test-only", str(script)], cwd=tmp_path, env=cluster.env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and "not available" in proc.stderr, (script.name, proc.stderr)


def test_cpu_mode_script_and_refusals(tmp_path, capsys):
    """CPU mode without a cluster: the script's lines, and the counts `gptforge slurm` refuses."""
    script = tmp_path / "cpu.sbatch"
    assert cli(["slurm", "--nodes", "2", "--gpus-per-node", "0", "--nproc-per-node", "4", "--out", str(script),
                "--", "pretrain", "--data", "d", "--out", "r", "--parallel.dp_shard", "8"]) == 0
    text = script.read_text()
    assert "#SBATCH --exclusive" in text and "--cpus-per-task=" not in text.split("srun")[0]
    assert "gpus-per-node" not in text and "NCCL" not in text
    assert "--nnodes 2 --nproc-per-node 4 --rdzv-backend c10d" in text and "NPROC=4" in text
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    # The thread share per process, as the script computes it from the node's CPUs.
    shell = ("SLURM_CPUS_ON_NODE=16; " + next(ln for ln in text.splitlines() if ln.startswith("CPUS=")) + "; NPROC=4; "
             + next(ln for ln in text.splitlines() if ln.startswith("export OMP_NUM_THREADS")) + "; echo $OMP_NUM_THREADS")
    assert subprocess.run(["bash", "-c", shell], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"}).stdout.strip() == "4"
    given = tmp_path / "given.sbatch"
    assert cli(["slurm", "--nodes", "1", "--gpus-per-node", "0", "--nproc-per-node", "2", "--cpus-per-task", "6",
                "--out", str(given), "--", "pretrain", "--data", "d", "--out", "r"]) == 0
    assert "#SBATCH --cpus-per-task=6" in given.read_text() and "--exclusive" not in given.read_text()
    capsys.readouterr()
    refused = {
        ("--gpus-per-node", "0"): "needs --nproc-per-node",
        ("--gpus-per-node", "4", "--nproc-per-node", "2"): "each process drives one GPU",
        ("--gpus-per-node", "-1"): "--gpus-per-node >= 0",
        ("--gpus-per-node", "0", "--nproc-per-node", "2", "--nodes", "2"): "does not use the 4 processes",
    }
    for args, message in refused.items():
        cmd = ["pretrain", "--data", "d", "--out", "r", *(["--parallel.dp_shard", "2"] if "--nodes" in args else [])]
        assert cli(["slurm", "--nodes", "1", *args, "--out", str(tmp_path / "x"), "--", *cmd]) == 2, args
        assert message in capsys.readouterr().err, args


def test_the_wrapped_command_is_checked_with_its_own_parser(tmp_path, capsys):
    """`slurm ... -- pretrain --train.max_stpes 10` (or --model gpt9) wrote the sbatch without complaint."""
    base = ["slurm", "--nodes", "1", "--gpus-per-node", "0", "--nproc-per-node", "2", "--out", str(tmp_path / "j.sbatch"),
            "--", "pretrain", "--data", "d", "--out", "r"]
    with pytest.raises(SystemExit) as e:  # the command's own parser prints its one line and exits 2
        cli([*base, "--train.max_stpes", "10"])
    assert e.value.code == 2 and "did you mean --train.max_steps" in capsys.readouterr().err
    assert cli([*base, "--model", "gpt9"]) == 2
    assert "unknown preset 'gpt9'" in capsys.readouterr().err
    assert cli([*base[:-6], "--", "pretrian", "--data", "d"]) == 2
    assert "did you mean 'pretrain'" in capsys.readouterr().err
    assert not (tmp_path / "j.sbatch").exists()
    assert cli([*base, "--resume", "auto", "--model", "gpt2-nano"]) == 0 and (tmp_path / "j.sbatch").is_file()
