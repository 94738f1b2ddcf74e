"""`gptforge launch`: its own options count wherever they stand (issue 18 item 8)."""

from __future__ import annotations

from gptforge.commands.launch import build_parser, split_launch_options
from gptforge.commands.launch import main as launch_main


def test_dry_run_after_the_subcommand_does_not_start_processes(capsys, monkeypatch):
    import subprocess

    def no_processes(*a, **k):
        raise AssertionError("launch started processes under --dry-run")
    monkeypatch.setattr(subprocess, "call", no_processes)
    assert launch_main(["--nproc-per-node", "8", "pretrain", "--data", "d", "--out", "r", "--dry-run"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.endswith("--nproc-per-node 8 -m gptforge.cli pretrain --data d --out r")


def test_launch_options_anywhere_and_values_in_both_forms():
    args = split_launch_options(build_parser(), ["pretrain", "--nnodes=2", "--data", "d", "--rdzv-endpoint", "h:1",
                                                 "--out", "r"])
    assert args.nnodes == 2 and args.rdzv_endpoint == "h:1"
    assert args.command == ["pretrain", "--data", "d", "--out", "r"]


def test_after_a_double_dash_everything_is_the_commands():
    args = split_launch_options(build_parser(), ["--dry-run", "pretrain", "--data", "d", "--", "--nnodes", "3"])
    assert args.dry_run and args.nnodes == 1
    assert args.command == ["pretrain", "--data", "d", "--nnodes", "3"]


def test_a_launch_option_without_its_value_is_refused(capsys):
    import pytest

    with pytest.raises(SystemExit) as e:
        launch_main(["pretrain", "--data", "d", "--nnodes"])
    assert e.value.code == 2
    assert "--nnodes" in capsys.readouterr().err


def test_dry_run_checks_the_command_and_its_layout(capsys):
    """`launch --dry-run --nproc-per-node 2 pretrain ... --parallel.tp 3` printed a torchrun line that cannot run."""
    import pytest

    base = ["--dry-run", "--nproc-per-node", "2", "pretrain", "--data", "d", "--out", "r"]
    assert launch_main([*base, "--parallel.tp", "2"]) == 0
    capsys.readouterr()
    from gptforge.errors import InputError

    with pytest.raises(InputError, match="does not"):
        launch_main([*base, "--parallel.tp", "3"])
    with pytest.raises(SystemExit):
        launch_main([*base, "--train.max_stpes", "10"])
    assert "did you mean --train.max_steps" in capsys.readouterr().err
    with pytest.raises(InputError, match="unknown preset 'gpt9'"):
        launch_main([*base, "--model", "gpt9"])
    assert "torch.distributed.run" not in capsys.readouterr().out
