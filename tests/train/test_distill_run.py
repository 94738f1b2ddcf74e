"""`gptforge distill`: the trainer with a distillation loss; resume is bit-exact; bad pairs are refused."""

from __future__ import annotations

import pytest

from gptforge.cli import main as cli
from gptforge.train.loggers import read_metrics

COMMON = ["--train.micro_batch_size", "2", "--train.eval_interval", "3", "--train.eval_steps", "1",
          "--train.warmup_steps", "1", "--train.tensorboard", "false", "--train.report", "false",
          "--model.block_size", "32", "--model.d_model", "32", "--model.dropout", "0.1", "--quiet"]


@pytest.fixture(scope="module")
def teacher(tiny_shards, tmp_path_factory):
    run = tmp_path_factory.mktemp("teacher") / "run"
    assert cli(["pretrain", "--data", str(tiny_shards), "--out", str(run), "--model.preset", "gpt2-nano",
                "--train.max_steps", "6", "--train.checkpoint_interval", "6", *COMMON]) == 0
    return run


def test_distill_runs_and_resumes_bit_exactly(teacher, tiny_shards, tmp_path):
    args = ["distill", "--teacher", str(teacher), "--student", "gpt2-nano", "--data", str(tiny_shards),
            "--alpha", "0.5", "--temperature", "2.0", "--train.max_steps", "6", "--train.checkpoint_interval", "3",
            "--model.n_layer", "1", *COMMON]
    full, part = tmp_path / "full", tmp_path / "part"
    assert cli([*args, "--out", str(full)]) == 0
    assert cli([*args, "--out", str(part), "--train.stop_at_step", "3"]) == 0  # stop_at_step ends cleanly
    assert cli(["distill", "--out", str(part), "--resume", "--quiet"]) == 0
    a = [(r["step"], r["loss"], r.get("val_loss")) for r in read_metrics(full)]
    b = [(r["step"], r["loss"], r.get("val_loss")) for r in read_metrics(part)]
    assert a == b and len(a) == 6
    import yaml

    doc = yaml.safe_load((full / "config.yaml").read_text())
    assert doc["distill"]["alpha"] == 0.5 and doc["distill"]["temperature"] == 2.0
    assert doc["model"]["n_layer"] == 1


def test_a_teacher_with_another_tokenizer_is_refused(teacher, tmp_path, capsys):
    from gptforge.data.prepare import PrepareConfig, prepare
    from tests.conftest import stdlib_sample_files

    other = tmp_path / "other"
    prepare(PrepareConfig(inputs=[str(p) for p in stdlib_sample_files()[:10]], out=str(other), vocab_size=300,
                          val_fraction=0.1, workers=1), show_progress=False)
    capsys.readouterr()
    assert cli(["distill", "--teacher", str(teacher), "--student", "gpt2-nano", "--data", str(other),
                "--out", str(tmp_path / "s"), "--train.max_steps", "2", *COMMON]) == 1
    assert "--teacher" in capsys.readouterr().err
