"""Inputs a run cannot use are refused up front with one clear line: nonsense schedules, a shard
folder given to report, a binary file given to finetune, a student longer than its teacher."""

from __future__ import annotations

import pytest

from gptforge.cli import main as cli
from gptforge.config import TrainConfig
from gptforge.errors import InputError

TINY = ["--model.preset", "gpt2-nano", "--model.block_size", "32", "--train.max_steps", "3",
        "--train.micro_batch_size", "2", "--train.eval_interval", "0", "--train.report", "false", "--quiet"]


def test_nonsense_schedules_are_refused():
    with pytest.raises(InputError, match="min_lr"):
        TrainConfig(lr=1e-3, min_lr=1.0).check_trainable()
    with pytest.raises(InputError, match="warmup_steps=1000 > train.max_steps=3"):
        TrainConfig(max_steps=3, warmup_steps=1000).check_trainable()


def test_report_refuses_a_shard_folder_and_keeps_its_curation_report(tiny_shards, capsys):
    before = (tiny_shards / "report.html").read_bytes()
    assert cli(["report", str(tiny_shards)]) == 1
    assert "shard folder" in capsys.readouterr().err
    assert (tiny_shards / "report.html").read_bytes() == before


def test_finetune_on_a_binary_file_is_one_line(tiny_shards, tmp_path, capsys):
    run = tmp_path / "base"
    assert cli(["pretrain", "--data", str(tiny_shards), "--out", str(run), *TINY]) == 0
    junk = tmp_path / "junk.jsonl"
    junk.write_bytes(bytes(range(256)) * 50)
    capsys.readouterr()
    assert cli(["finetune", "--from", str(run), "--data", str(junk), "--out", str(tmp_path / "ft"),
                "--train.max_steps", "2", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "binary file" in err and "Traceback" not in err


def test_a_student_longer_than_its_teacher_is_refused_before_a_run_folder(tiny_shards, tmp_path, capsys):
    teacher = tmp_path / "t"
    assert cli(["pretrain", "--data", str(tiny_shards), "--out", str(teacher), *TINY]) == 0
    capsys.readouterr()
    out = tmp_path / "s"
    assert cli(["distill", "--teacher", str(teacher), "--student", "gpt2-nano", "--data", str(tiny_shards),
                "--out", str(out), "--model.block_size", "64", "--train.max_steps", "2", "--quiet"]) == 1
    assert "teacher's model.block_size 32" in capsys.readouterr().err
    assert not out.exists()

