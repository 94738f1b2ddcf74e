import shutil

import pytest

from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.runtime import checkpoint as ck
from gptforge.train.loggers import read_metrics
from gptforge.train.run import train


def _cfg(**train_kw):
    model = ModelConfig(preset="gpt2-nano", block_size=32, dropout=0.1)
    tc = TrainConfig(max_steps=20, micro_batch_size=4, gradient_accumulation_steps=2, lr=3e-3, warmup_steps=3,
                     eval_interval=5, eval_steps=2, checkpoint_interval=0, tensorboard=False, **train_kw)
    return RunConfig(model=model, train=tc)


def test_resume_is_bit_exact(tiny_shards, tmp_path):
    full = train(_cfg(), tiny_shards, tmp_path / "full", progress=False)
    assert full.step == 20
    part = train(_cfg(stop_at_step=10), tiny_shards, tmp_path / "part", progress=False)
    assert part.step == 10 and part.stopped == "stop_at_step"
    assert ck.find_checkpoint(tmp_path / "part").name == "step_0000010"
    rest = train(_cfg(), tiny_shards, tmp_path / "part", resume=True, progress=False)
    assert rest.step == 20
    a = [r["loss"] for r in read_metrics(tmp_path / "full")]
    b = [r["loss"] for r in read_metrics(tmp_path / "part")]
    assert len(a) == len(b) == 20
    assert a == b  # bit for bit, dropout on
    va = [r.get("val_loss") for r in read_metrics(tmp_path / "full")]
    vb = [r.get("val_loss") for r in read_metrics(tmp_path / "part")]
    assert va == vb and va[4] is not None
    # Validation loss dropped while training.
    assert va[-1] < va[4]


def test_half_written_checkpoint_is_never_resumed(tiny_shards, tmp_path):
    run = tmp_path / "run"
    train(_cfg(stop_at_step=4), tiny_shards, run, progress=False)
    root = run / "checkpoints"
    good = ck.find_checkpoint(run)
    # A kill during a later save leaves a temp folder, or a step folder without its state file.
    shutil.copytree(good, root / ".tmp_step_0000008")
    (root / ".tmp_step_0000008" / ck.STATE_FILE).unlink()
    shutil.copytree(good, root / "step_0000006")
    (root / "step_0000006" / ".metadata").unlink()
    assert ck.find_checkpoint(run) == good
    # Even a `latest` pointing at the damaged folder falls back to the newest complete one.
    (root / "latest").write_text("step_0000006\n")
    assert ck.find_checkpoint(run) == good
    res = train(_cfg(stop_at_step=6), tiny_shards, run, resume=True, progress=False)
    assert res.step == 6
    steps = [r["step"] for r in read_metrics(run)]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_resume_without_checkpoint_is_a_clear_error(tiny_shards, tmp_path):
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        train(_cfg(), tiny_shards, tmp_path / "nothing", resume=True, progress=False)


def test_a_run_directory_is_never_mixed_with_another_run(tiny_shards, tmp_path):
    run = tmp_path / "run"
    train(_cfg(stop_at_step=2), tiny_shards, run, progress=False)
    with pytest.raises(FileExistsError, match="--resume"):
        train(_cfg(), tiny_shards, run, progress=False)
    assert [r["step"] for r in read_metrics(run)] == [1, 2]


def test_resume_on_data_with_another_tokenizer_is_refused(tiny_shards, tmp_path, capsys):
    from gptforge.data.prepare import PrepareConfig, prepare
    from tests.conftest import stdlib_sample_files

    other = tmp_path / "other"
    prepare(PrepareConfig(inputs=[str(p) for p in stdlib_sample_files(12)], out=str(other), vocab_size=300,
                          val_fraction=0.2, workers=1), show_progress=False)
    run = tmp_path / "run"
    train(_cfg(stop_at_step=2), tiny_shards, run, progress=False)
    with pytest.raises(ValueError, match="different tokenizer"):
        train(_cfg(), other, run, resume=True, progress=False)
    from gptforge.cli import main

    assert main(["evaluate", str(run), "--data", str(other)]) == 1
    assert "another tokenizer" in capsys.readouterr().err
    assert main(["evaluate", str(run), "--data", str(tiny_shards), "--max-tokens", "200"]) == 0


def test_cli_resume_continues_past_a_saved_stop_at_step(tiny_shards, tmp_path, capsys):
    from gptforge.cli import main

    run = tmp_path / "run"
    common = ["--data", str(tiny_shards), "--out", str(run), "--model.preset", "gpt2-nano", "--model.block_size",
              "32", "--train.max_steps", "6", "--train.micro_batch_size", "2", "--train.eval_interval", "0",
              "--train.tensorboard", "false", "--quiet"]
    assert main(["pretrain", *common, "--train.stop_at_step", "2"]) == 0
    assert main(["pretrain", "--data", str(tiny_shards), "--out", str(run), "--resume", "--quiet"]) == 0
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4, 5, 6]
    assert main(["pretrain", "--data", str(tiny_shards), "--out", str(run), "--resume", "--quiet"]) == 0
    assert "nothing to do" in capsys.readouterr().out
