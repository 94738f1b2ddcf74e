"""`gptforge launch` (torchrun) -> sharded checkpoint -> `gptforge export-checkpoint`; `gptforge slurm`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from gptforge.cli import main as cli
from gptforge.runtime import checkpoint as ck
from gptforge.runtime.loading import load_for_inference
from gptforge.train.loggers import read_metrics

TINY = ["--model.preset", "gpt2-nano", "--model.d_model", "32", "--model.block_size", "32",
        "--train.max_steps", "2", "--train.micro_batch_size", "2", "--train.eval_interval", "0",
        "--train.warmup_steps", "1", "--train.tensorboard", "false", "--quiet"]


def test_launch_dry_run_prints_the_torchrun_command(capsys):
    assert cli(["launch", "--nproc-per-node", "4", "--dry-run", "pretrain", "--data", "d", "--out", "r"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.endswith("-m torch.distributed.run --standalone --nnodes 1 --nproc-per-node 4 "
                        "-m gptforge.cli pretrain --data d --out r")
    assert cli(["launch", "--nnodes", "2", "--nproc-per-node", "8", "--rdzv-endpoint", "n0:29500", "--dry-run",
                "pretrain", "--data", "d", "--out", "r"]) == 0
    assert "--rdzv-backend c10d --rdzv-endpoint n0:29500 --rdzv-id gptforge --nnodes 2" in capsys.readouterr().out
    assert cli(["launch", "--nnodes", "2", "--dry-run", "pretrain", "--data", "d", "--out", "r"]) == 2
    assert "needs --rdzv-endpoint" in capsys.readouterr().err


def test_launch_fsdp_run_then_export(tiny_shards, tmp_path):
    run = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "gptforge.cli", "launch", "--nproc-per-node", "2", "pretrain",
                           "--data", str(tiny_shards), "--out", str(run), "--parallel.dp_shard", "2", *TINY],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "torch.distributed.run --standalone" in proc.stdout.splitlines()[0]
    assert proc.stdout.count("stopped (max_steps) at step 2") == 1  # rank 0's line only, not one per rank
    assert [r["step"] for r in read_metrics(run)] == [1, 2]
    ckpt = ck.find_checkpoint(run)
    assert len(list(ckpt.glob("*.distcp"))) == 2  # one shard file per rank

    out = tmp_path / "model.safetensors"
    assert cli(["export-checkpoint", str(run), "--out", str(out)]) == 0
    from safetensors import safe_open

    model, _, doc, _ = load_for_inference(run)
    with safe_open(str(out), "pt") as f:
        assert json.loads(f.metadata()["gptforge_model_config"]) == doc["model"]
        exported = {k: f.get_tensor(k) for k in f.keys()}
    reference = model.state_dict()
    assert set(exported) == set(reference)
    for k, v in reference.items():
        assert torch.equal(exported[k], v), k

    full = tmp_path / "all.pt"
    assert cli(["export-checkpoint", str(run), "--out", str(full), "--format", "torch"]) == 0
    sd = torch.load(full, weights_only=False)
    assert torch.equal(sd["model"]["wte.weight"], reference["wte.weight"])
    assert any(k.startswith("state.") and k.endswith("exp_avg") for k in sd["optim"])


def test_export_without_checkpoint_is_an_error(tmp_path, capsys):
    assert cli(["export-checkpoint", str(tmp_path), "--out", str(tmp_path / "m.safetensors")]) == 1
    assert "no complete checkpoint" in capsys.readouterr().err


def test_slurm_script(tmp_path, capsys):
    script = tmp_path / "job.sbatch"
    assert cli(["slurm", "--nodes", "2", "--gpus-per-node", "4", "--partition", "gpu", "--setup",
                "source .venv/bin/activate", "--out", str(script), "--", "pretrain", "--data", "my data",
                "--out", "run", "--parallel.dp_shard", "4", "--parallel.tp", "2"]) == 0
    text = script.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --gpus-per-node=4" in text and "#SBATCH --partition=gpu" in text
    assert "--nnodes 2 --nproc-per-node 4 --rdzv-backend c10d" in text
    assert '--rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT"' in text
    assert "-m gptforge.cli pretrain --data 'my data' --out run" in text
    assert "TORCH_NCCL_DUMP_ON_TIMEOUT" in text and "source .venv/bin/activate" in text
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    # A layout that does not fill nodes x GPUs is refused before anything waits in a queue.
    assert cli(["slurm", "--nodes", "2", "--gpus-per-node", "4", "--out", str(tmp_path / "x"), "--", "pretrain",
                "--parallel.dp_shard", "4"]) == 2
    assert "does not use the 8 GPUs" in capsys.readouterr().err
