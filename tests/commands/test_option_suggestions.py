"""A misspelt option's 'did you mean' names an option of the same command."""

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
    assert hint in err
    assert "--model.vocab_size" not in err or argv[0] == "pretrain"
