"""A misspelt option's 'did you mean' names an option of the same command, never the option typed, in\none line."""

from __future__ import annotations

import pytest

from gptforge.cli import main


@pytest.mark.parametrize("argv,hint", [
    (["generate", "run", "--promt", "x"], "did you mean --prompt?"),
    (["prepare", "in.txt", "--out", "o", "--vocab_size", "100"], "did you mean --vocab-size?"),
    (["evaluate", "run", "--text", "t", "--strid", "4"], "did you mean --stride?"),
    (["pretrain", "--data", "d", "--train.max_step", "3"], "did you mean --train.max_steps?"),
])
def test_suggestion_comes_from_the_commands_own_options(argv, hint, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert hint in err and len(err.strip().splitlines()) == 1
    assert "--model.vocab_size" not in err or argv[0] == "pretrain"


@pytest.mark.parametrize("argv,line", [
    (["generate", "run", "--stop-at-eos=yes"],
     "--stop-at-eos is a flag and takes no value (got --stop-at-eos=yes): write --stop-at-eos alone"),
    (["pretrain", "--data", "d", "--out", "o", "--train.lr", "-inf"],
     "--train.lr needs a value, and '-inf' reads as an option: write --train.lr=-inf"),
    (["pretrain", "--data", "d", "--out", "o", "--train.lr", "-1e-3"],
     "--train.lr needs a value, and '-1e-3' reads as an option: write --train.lr=-1e-3"),
    (["generate", "run", "--top-k"], "--top-k needs a value"),
    (["pretrain", "--data", "d"], "the following arguments are required: --out"),
    (["generate", "run", "--promt", "x", "--top-kk", "3"],
     "unknown option --promt: did you mean --prompt?; unknown option --top-kk: did you mean --top-k?"),
])
def test_a_misused_option_is_one_line_that_never_suggests_itself(argv, line, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == f"gptforge {argv[0]}: error: {line}"
    assert "did you mean --stop-at-eos" not in err and "did you mean --train.lr" not in err


def test_the_value_form_suggested_parses():
    from gptforge.commands.pretrain import build_parser
    from gptforge.options import parse_command

    _, init = parse_command(build_parser(), ["--data", "d", "--out", "o", "--train.lr=-1e-3"])
    assert init.train.lr == -1e-3
