"""Two `gptforge launch --nnodes 2` agents on one machine train like 2 processes on one node.

Each agent stands for a node with one process; they meet over loopback (endpoints on 127.0.0.1,
GLOO_SOCKET_IFNAME=lo), through the c10d rendezvous (one agent hosts the store) or the static
one (--node-rank). Same ranks, same data, same seed: the losses agree to 1e-6 relative with the
one-node run of the same `pretrain` command line (2 gloo processes of tests/train/dist_harness.py,
as `gptforge launch --nproc-per-node 2` starts them; that launch itself is run by
test_launch_export.py and test_resume_anywhere.py), under DDP and FSDP2; the two agents' FSDP2
checkpoint then resumes in one process without a launcher. A 2-layer d_model-32 model, 4 steps,
gloo on the CPU.

Also here: a rank lost after its second checkpoint, torchrun --max-restarts and --resume auto
(fault_entry.py holds the fault hook).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gptforge.commands.launch import LaunchOptions, launch_env, torchrun_command
from gptforge.train.loggers import read_metrics
from tests.train.dist_harness import free_port, run_layouts

REL = 1e-6
TINY = ["--model.preset", "gpt2-nano", "--model.d_model", "32", "--model.block_size", "32",
        "--train.max_steps", "4", "--train.micro_batch_size", "2", "--train.eval_interval", "0",
        "--train.warmup_steps", "1", "--train.tensorboard", "false", "--train.checkpoint_interval", "2",
        "--train.compile", "false", "--train.seed", "5", "--quiet"]
LAYOUTS = {"ddp": ["--parallel.dp_replicate", "2", "--parallel.dp_shard", "1"], "fsdp": ["--parallel.dp_shard", "2"]}
TIMEOUT_S = 300


def loopback_env() -> dict[str, str]:
    """The environment of a test's training processes: one thread each, gloo on loopback."""
    return dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")


def _pretrain(data: Path, run: Path, layout: str, extra: list[str]) -> list[str]:
    return ["pretrain", "--data", str(data), "--out", str(run), *LAYOUTS[layout], *TINY, *extra]


def _finish(procs: list[subprocess.Popen], what: str) -> None:
    """Wait for every process; on a failure or a timeout kill the rest and show their output."""
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=TIMEOUT_S)
            outputs.append((p.returncode, out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for rc, out in outputs:
        assert rc == 0, f"{what}: exit {rc}\n{out[-4000:]}"


def _launch(launch_args: list[str], command: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gptforge.cli", "launch", *launch_args, *command],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=loopback_env())


def one_node_runs(data: Path, root: Path) -> dict[str, list[float]]:
    """{layout: losses} of `pretrain` in 2 processes of one node, one run folder under `root` each."""
    jobs = [dict(name=layout, argv=_pretrain(data, root / layout, layout, []), run_dir=str(root / layout))
            for layout in LAYOUTS]
    runs = run_layouts(2, jobs, root / "out")
    for layout, r in runs.items():
        assert "error" not in r, f"one node, {layout}:\n{r['error']}"
    return {layout: r["loss"] for layout, r in runs.items()}


def two_agents(data: Path, run: Path, layout: str, backend: str, extra: list[str] = ()) -> list[float]:
    """Losses of two `gptforge launch --nnodes 2 --nproc-per-node 1` agents started together."""
    endpoint = f"127.0.0.1:{free_port()}"
    procs = []
    for node in range(2):
        args = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", backend, "--rdzv-endpoint", endpoint,
                "--rdzv-id", f"test-{run.name}"]
        if backend == "static":
            args += ["--node-rank", str(node)]
        procs.append(_launch(args, _pretrain(data, run, layout, list(extra))))
    _finish(procs, f"two agents, {backend} rendezvous, {layout}")
    return [r["loss"] for r in read_metrics(run)]


def assert_close(got: list[float], want: list[float], what: str, rel: float = REL) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} logged steps, expected {len(want)}"
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert abs(a - b) <= rel * abs(b), f"{what}: step {i + 1} loss {a!r} vs one agent's {b!r}"


@pytest.fixture(scope="module")
def one_agent_losses(tiny_shards, tmp_path_factory) -> dict[str, list[float]]:
    """The one-node reference losses of each layout (`one_node_runs`)."""
    return one_node_runs(tiny_shards, tmp_path_factory.mktemp("one_agent"))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["c10d", "static"])
def test_two_agents_ddp_equal_one_agent(backend, tiny_shards, tmp_path, one_agent_losses):
    got = two_agents(tiny_shards, tmp_path / "run", "ddp", backend)
    assert_close(got, one_agent_losses["ddp"], f"DDP, two agents ({backend})")


@pytest.mark.slow
def test_two_agents_fsdp_equal_one_agent_and_resume_in_one_process(tiny_shards, tmp_path, one_agent_losses):
    from gptforge.cli import main as cli
    from gptforge.runtime import checkpoint as ck

    run = tmp_path / "run"
    want = one_agent_losses["fsdp"]
    got = two_agents(tiny_shards, run, "fsdp", "c10d", ["--train.stop_at_step", "2"])
    assert_close(got, want[:2], "FSDP2, two agents (c10d)")
    ckpt = ck.find_checkpoint(run)
    assert ckpt.name == ck.step_dir_name(2), ckpt
    assert len(list(ckpt.glob("*.distcp"))) == 2  # one shard file per rank, one rank per agent

    # One process, no launcher: one shard instead of the 2 asked for; accumulation keeps the global batch.
    assert cli(["pretrain", "--out", str(run), "--resume", "--parallel.dp_shard", "1", "--quiet"]) == 0
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # Another process count sums in another order: the cross-layout tolerance of test_distributed.
    assert_close([r["loss"] for r in rows[2:]], want[2:], "FSDP2 checkpoint of two agents, resumed in one process",
                 rel=1e-5)


def test_resume_auto_decides_from_the_run_folder(tmp_path, capsys):
    from gptforge.train.resume import resume_auto_argv

    run = tmp_path / "run"
    assert resume_auto_argv(["--out", str(run), "--resume", "auto", "--quiet"], "p") == ["--out", str(run), "--quiet"]
    assert "no run in" in capsys.readouterr().out
    run.mkdir()
    (run / "config.yaml").write_text("train: {}\n")
    assert resume_auto_argv(["--resume=auto", "--out", str(run)], "p") == ["--out", str(run), "--resume"]
    assert "holds a run: resuming it" in capsys.readouterr().out
    assert resume_auto_argv(["--out", str(run), "--resume"], "p") == ["--out", str(run), "--resume"]


@pytest.mark.slow
def test_lost_rank_restart_resumes_with_uninterrupted_losses(tiny_shards, tmp_path, one_agent_losses):
    """Rank 1 of a 2-process DDP run exits hard after its second checkpoint (step 2); torchrun
    --max-restarts 1 restarts the group with the same command line, which resumes from step 2."""
    run, marker = tmp_path / "run", tmp_path / "fault.txt"
    entry = Path(__file__).with_name("fault_entry.py")
    # torchrun as `gptforge launch --max-restarts 1` starts it (its command line and environment),
    # with the fault entry point in place of gptforge.cli.
    opts = LaunchOptions(nproc_per_node="2", max_restarts=1, command=["pretrain"])
    torchrun = torchrun_command(opts)[:-3]
    assert torchrun[-2:] == ["--max-restarts", "1"], torchrun
    env = dict(launch_env(opts, loopback_env()), FAULT_RANK="1", FAULT_AFTER_CHECKPOINTS="2", FAULT_MARKER=str(marker))
    cmd = [*torchrun, str(entry),
           *_pretrain(tiny_shards, run, "ddp", ["--train.checkpoint_interval", "1", "--resume", "auto"])]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          timeout=TIMEOUT_S)
    (tmp_path / "torchrun.log").write_text(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert marker.read_text().startswith("rank 1 exits after step_"), "the fault hook never fired"
    assert "--resume auto (torchrun restart 1): " in proc.stdout and "resuming it" in proc.stdout, proc.stdout[-4000:]
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [e["kind"] for e in rows[2].get("events", [])] == ["resume"]  # steps 3-4 ran after the restart
    assert_close([r["loss"] for r in rows], one_agent_losses["ddp"], "restarted after a lost rank")


def test_launch_env_unshares_the_rendezvous_store_only_for_restarts():
    plain = launch_env(LaunchOptions(command=["pretrain"]), {"PATH": "/bin"})
    assert plain == {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    restarts = launch_env(LaunchOptions(max_restarts=2, command=["pretrain"]), {"OMP_NUM_THREADS": "4"})
    assert restarts == {"OMP_NUM_THREADS": "4", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    kept = launch_env(LaunchOptions(max_restarts=2, command=["pretrain"]), {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"})
    assert kept["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "0"
