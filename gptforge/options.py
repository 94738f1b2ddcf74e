"""One way to parse every command: a typed dataclass of options, attribute docstrings as `--help`.

A command declares its own options as a dataclass; each field becomes `--field-name` (hyphens,
the spelling rule for a command's own options) with the field's type, default and docstring.
Config sections (`model`, `train`, `parallel`, ...) are added as dotted keys with the fields'
underscore names (`--train.max_steps`), the same in YAML recipes (`--config recipe.yaml`).
Parsing itself is jsonargparse's (typed values, Optional, Literal choices, lists).

    @dataclass
    class GenerateOptions:
        model: str
        '''Run directory or checkpoint folder.'''
        max_new_tokens: int = 200
        '''Tokens to generate per sample.'''

    opts, _ = parse_command(command_parser("gptforge generate", "...", GenerateOptions,
                                           positional=("model",)), argv)
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import sys
import textwrap
import types
import typing
from itertools import pairwise
from typing import Any

from gptforge.ranges import bounded, out_of_range, range_text  # noqa: F401  (bounded: re-exported for commands)


def attribute_docs(cls: type) -> dict[str, str]:
    """{field name: its attribute docstring} of a dataclass, read from its source (and its bases')."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for a, b in pairwise(body):
            if (isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr)
                    and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)):
                docs[a.target.id] = " ".join(b.value.value.split())
    return docs


def command_parser(prog: str, description: str, options: type | None = None,
                   sections: dict[str, type] | None = None, positional: tuple[str, ...] = (),
                   config_file: bool | None = None):
    """A jsonargparse parser for one command.

    Args:
        options: dataclass of the command's own options (`--max-new-tokens`); fields without a
            default are required; bool fields are flags (`--flag`, or `--no-flag` when the
            default is True); `field(metadata={"flag": "--from"})` names an option whose name is
            no Python identifier; `field(metadata={"aliases": ("--no-progress",)})` accepts other
            spellings of one option (kept for old command lines; --help names them as aliases).
        sections: {name: dataclass} added as dotted keys (`--train.lr`), each field's docstring its help.
        positional: fields of `options` taken by position instead (`gptforge generate RUN`).
        config_file: add `--config recipe.yaml` (default: when there are sections).

    With a `model` section, `--model NAME` is short for `--model.preset NAME` (`parse_command`
    rewrites it; a path that exists keeps jsonargparse's meaning, a YAML file for the section),
    and the description says so.
    """
    import jsonargparse

    if "model" in (sections or {}):
        description = description.rstrip() + " " + MODEL_SHORTHAND_HELP

    jsonargparse.set_parsing_settings(docstring_parse_attribute_docstrings=True)
    parser = jsonargparse.ArgumentParser(prog=prog, description=description, exit_on_error=False,
                                         allow_abbrev=False)  # a misspelt option is an error, not a guess
    if config_file if config_file is not None else bool(sections):
        parser.add_argument("--config", action=jsonargparse.ActionConfigFile,
                            help="YAML recipe with one section per config group (any subset of keys).")
    for name, cls in (sections or {}).items():
        parser.add_class_arguments(cls, name, help=(cls.__doc__ or "").strip().splitlines()[0])
    if options is not None:
        add_options(parser, options, positional)
    # What parse_options reads back from the parser (jsonargparse is imported lazily, so no subclass).
    parser.options_class = options  # type: ignore[attr-defined]
    parser.model_shorthand = "model" in (sections or {})  # type: ignore[attr-defined]
    return parser


MODEL_SHORTHAND_HELP = "--model NAME is short for --model.preset NAME."


def rewrite_model_shorthand(argv: list[str]) -> list[str]:
    """`--model NAME` / `--model=NAME` -> `--model.preset NAME` unless NAME is an existing path
    (then it stays a YAML file for the model section, jsonargparse's meaning)."""
    import os

    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--model" and i + 1 < len(argv) and not os.path.exists(argv[i + 1]):
            out += ["--model.preset", argv[i + 1]]
            i += 2
            continue
        if a.startswith("--model=") and not os.path.exists(a.split("=", 1)[1]):
            out.append("--model.preset=" + a.split("=", 1)[1])
        else:
            out.append(a)
        i += 1
    return out


def check_ranges(opts: Any) -> None:
    """Raise ValueError naming the first `bounded` field of dataclass instance `opts` whose value
    is outside its range: "--stride must be >= 1, got 0"."""
    bad = out_of_range(opts)
    if bad is not None:
        name, value, allowed = bad
        f = next(f for f in dataclasses.fields(opts) if f.name == name)
        flag = f.metadata.get("flag", "--" + name.replace("_", "-"))
        raise ValueError(f"{flag} must be {allowed}, got {value}")


def add_options(parser, options: type, positional: tuple[str, ...] = ()) -> None:
    """Add the fields of dataclass `options` to `parser` (see `command_parser`)."""
    docs = attribute_docs(options)
    hints = typing.get_type_hints(options)
    for f in dataclasses.fields(options):
        help_text = docs.get(f.name, "")
        if "range" in f.metadata:
            help_text += f" (must be {range_text(*f.metadata['range'])})"
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        factory = f.default_factory
        default = None if required else (f.default if f.default is not dataclasses.MISSING
                                         else factory() if callable(factory) else None)
        kind = hints[f.name]
        if f.name in positional:  # a list takes many values (any number when it has a default)
            nargs = ("*" if not required else "+") if typing.get_origin(kind) is list else None
            parser.add_argument(f.name, type=kind if nargs is None else typing.get_args(kind)[0], nargs=nargs,
                                help=help_text, **({"default": default} if nargs == "*" else {}))
            continue
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))  # e.g. --from for a field `source`
        aliases = tuple(f.metadata.get("aliases", ()))
        if aliases:
            help_text += f" ({', '.join(aliases)}: {'aliases' if len(aliases) > 1 else 'an alias'} of {flag})"
        if kind is bool:
            if default:
                parser.add_argument("--no-" + f.name.replace("_", "-"), *aliases, dest=f.name, action="store_false",
                                    help=help_text)
            else:
                parser.add_argument(flag, *aliases, dest=f.name, action="store_true", help=help_text)
            continue
        is_union = typing.get_origin(kind) in (typing.Union, types.UnionType)  # Optional[X] and X | None
        inner = [a for a in typing.get_args(kind) if a is not type(None)] if is_union else [kind]
        if len(inner) == 1 and typing.get_origin(inner[0]) is list:  # list[str] / Optional[list[str]]: --tasks a b c
            parser.add_argument(flag, dest=f.name, type=typing.get_args(inner[0])[0], nargs="+", default=default,
                                required=required, help=help_text)
            continue
        parser.add_argument(flag, *aliases, dest=f.name, type=kind, default=default, required=required,
                            help=help_text)


def allowed_values(kind: Any) -> list[str] | None:
    """The values a choice type accepts, as written on the command line: `Literal["a", "b"]` ->
    ['a', 'b'], `bool` -> ['true', 'false'], `Union[bool, Literal["auto"]]` -> ['true', 'false',
    'auto'] (None in an Optional is left out). None when `kind` is not made only of bool, Literal
    and None (an int or str option has no list of values)."""
    if kind is bool:
        return ["true", "false"]
    if kind is type(None):
        return []
    origin = typing.get_origin(kind)
    if origin is typing.Literal:
        return [str(a).lower() if isinstance(a, bool) else str(a) for a in typing.get_args(kind)]
    if origin in (typing.Union, types.UnionType):
        out: list[str] = []
        for a in typing.get_args(kind):
            sub = allowed_values(a)
            if sub is None:
                return None
            out += [v for v in sub if v not in out]
        return out or None
    return None


def expected_number(kind) -> str | None:
    """'an integer' / 'a number' for an int or float option's type hint (Optional ones too: their
    None means the option's documented default); None for any other type."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) != 1:
            return None
        kind = args[0]
    return {int: "an integer", float: "a number"}.get(kind)


def choice_error(parser, message: str, argv: list[str]) -> str | None:
    """One line for a jsonargparse error about a value outside a choice option's values, or one
    that is not a number for a numeric option: "--train.compile: invalid value 'maybe'; allowed
    values: true, false, auto", "--train.lr: invalid value 'abc'; expected a number". None when
    `message` is about something else (an unknown option, ...)."""
    import re

    key = re.search(r'Parser key "([^"]+)"', message)
    given = re.search(r"(?:Given|Got) value: (.*)", message)
    if not key or not given:
        return None
    action = next((a for a in parser._actions if a.dest == key.group(1)), None)
    hint = getattr(action, "_typehint", None) if action is not None else None
    allowed = allowed_values(hint)
    expected = None if allowed else expected_number(hint)
    if not allowed and expected is None:
        return None
    flag = next(iter(action.option_strings), key.group(1))
    # jsonargparse quotes the value it read (1e9 as 1000000000.0); of a repeated option, the bad one
    typed = typed_value(flag, argv, lambda v: _accepted(v, allowed, expected))
    value = typed if typed is not None else given.group(1).strip()
    want = f"allowed values: {', '.join(allowed)}" if allowed else f"expected {expected}"
    line = f"{flag}: invalid value {value!r}; {want}"
    if expected == "an integer" and _integral(value):
        line += f" (in digits: {int(float(value))})"
    recipes = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"]
    if recipes and typed is None:
        line += f" (key {key.group(1)} in recipe {recipes[-1]})"
    return line


def typed_value(flag: str, argv: list[str], valid=None) -> str | None:
    """The value of the last `flag VALUE` or `flag=VALUE` in `argv`, as the user typed it (with
    `valid`, a predicate: the first value it refuses, when one is); None when `flag` is not on the
    command line (a recipe set it)."""
    values = []
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            values.append(argv[i + 1])
        elif a.startswith(flag + "="):
            values.append(a[len(flag) + 1:])
    bad = [v for v in values if valid is not None and not valid(v)]
    return bad[0] if bad else (values[-1] if values else None)


def _accepted(text: str, allowed: list[str] | None, expected: str | None) -> bool:
    """Whether `text` is one of `allowed`, or parses as the `expected` kind of number (finite)."""
    if allowed:
        return text in allowed or text.lower() in allowed
    try:
        return int(text) is not None if expected == "an integer" else math.isfinite(float(text))
    except ValueError:
        return False


def _integral(text: str) -> bool:
    """Whether `text` is a finite number with an integer value written otherwise (1e9, 2.0)."""
    try:
        return float(text).is_integer()
    except ValueError:
        return False


def named_as_typed(parser, message: str) -> str:
    """argparse's "the following arguments are required: out, gpus_per_node" with each option's
    own spelling (--out, --gpus-per-node); positional arguments keep their names. Any other
    message is returned as it is."""
    head = "the following arguments are required: "
    if not message.startswith(head):
        return message
    flags = {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings}
    names = [n.strip() for n in message[len(head):].split(",")]
    return head + ", ".join(flags.get(n, n) for n in names)


def parse_command(parser, argv: list[str]) -> tuple[Any, Any]:
    """Parse `argv` with a `command_parser`.

    Returns: (the options dataclass instance, or None without one; the instantiated namespace,
    whose section attributes are dataclass instances).

    `--model NAME` becomes `--model.preset NAME` for a parser with a model section (see
    `rewrite_model_shorthand`). An options dataclass with a `quiet` field sets the progress mode
    (`gptforge.progress.set_quiet`), so --quiet silences every progress display of the command.

    Raises:
        SystemExit(2): a bad option or value (a `bounded` field outside its range included; a
        value outside a choice option's values, in one line naming them, see `choice_error`),
        after printing `PROG: error: ...` with a 'did you mean' hint for a misspelt option or key.
    """
    from gptforge.config import describe_parse_error

    if getattr(parser, "model_shorthand", False):
        argv = rewrite_model_shorthand(list(argv))
    try:
        ns = parser.parse_args(argv)
    except SystemExit:
        raise
    except Exception as e:  # jsonargparse.ArgumentError and friends
        choice = choice_error(parser, str(e), argv)
        if choice is not None:
            print(f"{parser.prog}: error: {choice}", file=sys.stderr)
            raise SystemExit(2) from None
        own = [o[2:] for a in parser._actions for o in a.option_strings
               if o.startswith("--") and o not in ("--help", "--print_config")]
        message = describe_parse_error(named_as_typed(parser, str(e)), argv, own)
        print(f"{parser.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2) from None
    init = parser.instantiate(ns) if hasattr(parser, "instantiate") else ns
    cls = getattr(parser, "options_class", None)
    opts = None
    if cls is not None:
        opts = cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)})
        try:
            check_ranges(opts)
        except ValueError as e:
            print(f"{parser.prog}: error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        if hasattr(opts, "quiet"):  # one switch for every progress display of the command
            from gptforge.progress import set_quiet

            set_quiet(bool(opts.quiet))
    return opts, init
