"""Resume needs no flags: a run trained on two ranks resumes on one process from its saved config,
and without --data (or with a new --data when the data folder moved)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import yaml

from gptforge.cli import main as cli
from gptforge.train.loggers import read_metrics

TINY = ["--model.preset", "gpt2-nano", "--model.d_model", "32", "--model.block_size", "32",
        "--train.max_steps", "4", "--train.micro_batch_size", "2", "--train.eval_interval", "0",
        "--train.warmup_steps", "1", "--train.checkpoint_interval", "2", "--train.tensorboard", "false",
        "--train.seed", "3", "--quiet"]


def _gptforge(*args, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "gptforge.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_two_ranks_with_no_flags_train_fsdp_then_resume_on_one_process_with_no_flags(tiny_shards, tmp_path):
    run = tmp_path / "run"
    proc = _gptforge("launch", "--nproc-per-node", "2", "pretrain", "--data", str(tiny_shards), "--out", str(run),
                     *TINY, "--train.stop_at_step", "2")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    doc = yaml.safe_load((run / "config.yaml").read_text())
    assert doc["parallel"]["dp_shard"] == -1  # as asked
    assert doc["layout"]["dp_shard"] == 2 and doc["layout"]["zero_stage"] == 3  # as run: FSDP2 over 2
    assert doc["train"]["global_batch_size"] == 4
    # Reference: the same 4 steps in one process with the same global batch.
    ref = tmp_path / "ref"
    assert cli(["pretrain", "--data", str(tiny_shards), "--out", str(ref), *TINY,
                "--train.gradient_accumulation_steps", "2"]) == 0
    # No --data, no parallel flags, no batch flags: the saved config decides, re-resolved for 1 process.
    assert cli(["pretrain", "--out", str(run), "--resume", "--quiet"]) == 0
    got = {r["step"]: r["loss"] for r in read_metrics(run)}
    want = {r["step"]: r["loss"] for r in read_metrics(ref)}
    assert sorted(got) == [1, 2, 3, 4]
    for step in (3, 4):
        assert got[step] == pytest.approx(want[step], rel=1e-4), step
    doc = yaml.safe_load((run / "config.yaml").read_text())
    assert doc["layout"]["world_size"] == 1 and doc["train"]["gradient_accumulation_steps"] == 2


def test_resume_without_data_and_a_moved_data_folder(tiny_shards, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(tiny_shards, data)
    run = tmp_path / "run"
    assert cli(["pretrain", "--data", str(data), "--out", str(run), *TINY, "--train.stop_at_step", "2"]) == 0
    assert cli(["pretrain", "--out", str(run), "--resume", "--train.stop_at_step", "3", "--quiet"]) == 0
    assert max(r["step"] for r in read_metrics(run)) == 3
    shutil.move(str(data), str(tmp_path / "moved"))
    capsys.readouterr()
    assert cli(["pretrain", "--out", str(run), "--resume", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert f"gptforge pretrain: error: --resume: the run was trained on {data}" in err and "--data" in err
    assert cli(["pretrain", "--out", str(run), "--resume", "--data", str(tmp_path / "moved"), "--quiet"]) == 0
    assert max(r["step"] for r in read_metrics(run)) == 4

