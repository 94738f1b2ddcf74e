"""A run folder left with no checkpoint (the first step failed, or the run was killed before its
first checkpoint) can be started again."""

from __future__ import annotations

from gptforge.cli import main as cli
from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.train.run import train

TINY = ["--model.preset", "gpt2-nano", "--model.block_size", "32", "--train.max_steps", "3",
        "--train.micro_batch_size", "2", "--train.eval_interval", "0", "--train.report", "false", "--quiet"]


def test_a_run_that_failed_before_its_first_row_can_be_started_again(tiny_shards, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")  # opened, never written: the first step failed
    assert cli(["pretrain", "--data", str(tiny_shards), "--out", str(run), *TINY]) == 0


def test_resume_of_a_run_killed_before_its_first_checkpoint_starts_fresh(tiny_shards, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints" / ".tmp_step_0000005").mkdir(parents=True)  # a half-written first checkpoint
    (run / "metrics.jsonl").write_text("")
    (run / "config.yaml").write_text("model: {preset: gpt2-nano}\n")  # written at start, before any step
    said = []
    cfg = RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32),
                    train=TrainConfig(max_steps=3, micro_batch_size=2, eval_interval=0, tensorboard=False,
                                      report=False))
    r = train(cfg, tiny_shards, run, resume=True, progress=False, log=said.append)
    assert r.step == 3 and any("starting fresh" in m for m in said)

