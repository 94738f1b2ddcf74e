"""The trainer redesign's guarantees: world-filling layouts, resume across world sizes without flags,
resume without --data, one error format for every command, planner-only values refused up front,
out-of-memory advice, and one set of layout rules for the planner and the trainer."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

from gptforge.cli import main as cli
from gptforge.config import ModelConfig, ParallelConfig, RunConfig, TrainConfig
from gptforge.errors import InputError, TrainingError
from gptforge.plan.advice import fit_changes, out_of_memory_message
from gptforge.plan.memory import planning_layout
from gptforge.plan.memory import validate as planner_validate
from gptforge.train.loggers import read_metrics

TINY = ["--model.preset", "gpt2-nano", "--model.d_model", "32", "--model.block_size", "32",
        "--train.max_steps", "4", "--train.micro_batch_size", "2", "--train.eval_interval", "0",
        "--train.warmup_steps", "1", "--train.checkpoint_interval", "2", "--train.tensorboard", "false",
        "--train.seed", "3", "--quiet"]


def _gptforge(*args, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "gptforge.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_parallel_degrees_fill_the_world():
    assert ParallelConfig().resolved(4).dp_shard == 4
    assert ParallelConfig(tp=2).resolved(8).dp_shard == 4
    assert ParallelConfig(dp_shard=2, dp_replicate=-1).resolved(8).dp_replicate == 4
    assert ParallelConfig().resolved(1).effective_zero_stage() == 0
    assert ParallelConfig().resolved(2).effective_zero_stage() == 3
    with pytest.raises(InputError, match="not divisible"):
        ParallelConfig(tp=3).resolved(4)
    with pytest.raises(InputError, match="only one parallel degree"):
        ParallelConfig(tp=-1).resolved(4)


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


@pytest.mark.parametrize("args,where", [
    (["generate", "/nonexistent/run"], "/nonexistent/run"),
    (["evaluate", "/nonexistent/run", "--text", "/nonexistent/t.txt"], "/nonexistent"),
    (["convert", "--to-hf", "/nonexistent/run", "--out", "/tmp/x-never"], "/nonexistent/run"),
    (["pretrain", "--data", "/nonexistent/shards", "--out", "RUNDIR"], "/nonexistent/shards"),
    (["prepare", "/nonexistent/corpus.txt", "--out", "OUTDIR"], "/nonexistent/corpus.txt"),
    (["export-checkpoint", "/nonexistent/run", "--out", "/tmp/x-never.safetensors"], "/nonexistent/run"),
])
def test_one_error_format_across_commands(args, where, tmp_path):
    args = [str(tmp_path / a) if a in ("RUNDIR", "OUTDIR") else a for a in args]
    proc = _gptforge(*args, timeout=120)
    assert proc.returncode in (1, 2), proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert lines and lines[-1].startswith(f"gptforge {args[0]}: error: "), proc.stderr
    assert where in proc.stderr
    assert "Traceback" not in proc.stderr


def test_debug_shows_the_traceback():
    proc = _gptforge("--debug", "generate", "/nonexistent/run", timeout=120)
    assert proc.returncode != 0 and "Traceback" in proc.stderr


@pytest.mark.parametrize("flag,value", [("--train.optimizer", "adafactor"), ("--train.optimizer", "adamw8bit"),
                                        ("--train.precision", "fp8"), ("--train.warmup_steps", "-5"),
                                        ("--train.micro_batch_size", "0"), ("--train.max_steps", "0")])
def test_untrainable_values_are_refused_before_anything_starts(flag, value, tiny_shards, tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(["pretrain", "--data", str(tiny_shards), "--out", str(run), *TINY, flag, value]) == 1
    err = capsys.readouterr().err
    assert f"train.{flag.split('.')[1]}" in err and ("plan" in err or "must be" in err)
    assert not run.exists()  # refused before the run directory was made


def test_planner_and_trainer_share_one_set_of_layout_rules():
    mc = ModelConfig(preset="gpt2-mini", vocab_size=1000).resolved()
    tc = TrainConfig()
    cases = [ParallelConfig(dp_shard=8, offload="optimizer"), ParallelConfig(dp_replicate=2, tp=2),
             ParallelConfig(offload="optimizer"), ParallelConfig(tp=2, dp_shard=2, zero_stage=1),
             ParallelConfig(dp_shard=4, zero_stage=2), ParallelConfig(dp_replicate=2, dp_shard=2)]
    for pc in cases:
        world = planning_layout(pc).world_size
        trainer_ok = planner_ok = True
        try:
            pc.validate(world)
        except InputError:
            trainer_ok = False
        try:
            planner_validate(mc, tc, pc)
        except ValueError:
            planner_ok = False
        assert trainer_ok == planner_ok, pc
    # The drift the issue found: offload=optimizer with dp_shard 8 runs as ZeRO-3, so both accept it.
    ParallelConfig(dp_shard=8, offload="optimizer").validate(8)


def test_out_of_memory_advice_lists_changes_that_fit():
    mc = ModelConfig(preset="gpt2-small", vocab_size=50257).resolved()
    tc = TrainConfig(micro_batch_size=16, gradient_accumulation_steps=1, precision="bf16")
    pc = ParallelConfig(dp_replicate=8, dp_shard=1)
    fixes = fit_changes(mc, tc, pc, capacity_bytes=12 * 2**30)
    assert fixes, "a 12 GiB device fits gpt2-small with smaller micro-batches or checkpointing"
    assert all(b <= 12 * 2**30 for _, b in fixes)
    msg = out_of_memory_message(mc, tc, pc, 12 * 2**30, 11 * 2**30)
    assert "planner predicted a peak of" in msg and "measured peak 11.00 GiB" in msg
    assert "--train.micro_batch_size 8 --train.gradient_accumulation_steps 2" in msg


def test_a_simulated_out_of_memory_error_prints_the_planners_view(tiny_shards, tmp_path, monkeypatch, capsys):
    import gptforge.train.trainer as trainer_mod

    def oom(self, step, stop):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", oom)
    with pytest.raises(TrainingError, match="planner predicted a peak of"):
        from gptforge.train.run import train

        train(RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32),
                        train=TrainConfig(max_steps=2, micro_batch_size=2, eval_interval=0, tensorboard=False)),
              tiny_shards, tmp_path / "run", progress=False)
    capsys.readouterr()
    assert cli(["pretrain", "--data", str(tiny_shards), "--out", str(tmp_path / "run2"), *TINY]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gptforge pretrain: error: out of memory: the planner predicted")
