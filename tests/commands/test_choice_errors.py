"""A value outside a choice option's values fails in one line naming the option, the value and the
allowed values; `--model NAME` is short for `--model.preset NAME` wherever there is a model section."""

from __future__ import annotations

import pytest

from gptforge.cli import main
from gptforge.options import allowed_values, command_parser, parse_command


def _error(argv, capsys) -> str:
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    assert rc == 2
    return capsys.readouterr().err.strip()


@pytest.mark.parametrize("argv,line", [
    (["pretrain", "--data", "d", "--train.compile", "maybe"],
     "--train.compile: invalid value 'maybe'; allowed values: true, false, auto"),
    (["export", "run", "--dtype", "f64"], "--dtype: invalid value 'f64'; allowed values: f32, f16, bf16"),
    (["pretrain", "--data", "d", "--train.optimizer=adam"],
     "--train.optimizer: invalid value 'adam'; allowed values: adamw, sgd, muon, adamw8bit, adafactor"),
    (["pretrain", "--data", "d", "--train.tensorboard", "maybe"],
     "--train.tensorboard: invalid value 'maybe'; allowed values: true, false"),
    (["pretrain", "--data", "d", "--train.lr", "abc"], "--train.lr: invalid value 'abc'; expected a number"),
    (["pretrain", "--data", "d", "--train.max_steps", "1.5"],
     "--train.max_steps: invalid value '1.5'; expected an integer"),
    (["generate", "run", "--max-new-tokens", "1e9"],
     "--max-new-tokens: invalid value '1e9'; expected an integer (in digits: 1000000000)"),
    (["pretrain", "--data", "d", "--train.max_steps=2.0"],
     "--train.max_steps: invalid value '2.0'; expected an integer (in digits: 2)"),
    (["evaluate", "run", "--text", "t", "--stride", "1e3"],
     "--stride: invalid value '1e3'; expected an integer (in digits: 1000)"),
])
def test_bad_choice_is_one_line_with_the_allowed_values(argv, line, capsys):
    err = _error(argv, capsys)
    assert err.endswith("error: " + line)
    assert len(err.splitlines()) == 1 and "Union" not in err


def test_bad_choice_in_a_recipe_names_the_recipe(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("train:\n  compile: maybe\n")
    err = _error(["pretrain", "--data", "d", "--config", str(recipe)], capsys)
    assert "--train.compile: invalid value 'maybe'; allowed values: true, false, auto" in err
    assert str(recipe) in err and len(err.splitlines()) == 1


def test_allowed_values_only_for_choice_types():
    from typing import Literal, Optional, Union
    assert allowed_values(Union[bool, Literal["auto"]]) == ["true", "false", "auto"]
    assert allowed_values(Optional[Literal["a", "b"]]) == ["a", "b"]
    assert allowed_values(Optional[float]) is None and allowed_values(int) is None


@pytest.mark.parametrize("prog", ["pretrain", "plan", "distill"])
def test_model_shorthand_works_and_help_says_so_in_every_command_with_a_model_section(prog, capsys):
    import importlib
    mod = importlib.import_module(f"gptforge.commands.{prog}")
    parser = mod.build_parser() if hasattr(mod, "build_parser") else (
        mod._parser() if hasattr(mod, "_parser") else None)
    if parser is None:
        from gptforge.config import SECTIONS
        parser = command_parser(f"gptforge {prog}", "x", mod.DistillOptions, sections=SECTIONS)
    assert "--model NAME is short for --model.preset NAME" in parser.format_help()
    required = {"pretrain": ["--data", "d", "--out", "o"], "plan": [], "distill": ["--out", "o"]}[prog]
    _, init = parse_command(parser, required + ["--model", "gpt2-nano", "--model.n_layer", "3"])
    assert init.model.preset == "gpt2-nano" and init.model.n_layer == 3
    _, init = parse_command(parser, required + ["--model=gpt2-nano"])
    assert init.model.preset == "gpt2-nano"


def test_no_model_shorthand_text_without_a_model_section():
    from gptforge.commands.finetune import build_parser
    assert "short for --model.preset" not in build_parser().format_help()
