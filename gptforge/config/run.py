"""The whole run (`RunConfig`: model, train and parallel sections) and the hints added to a parser's
error about an unknown option, key or section."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field, fields

from gptforge.config.model import ModelConfig
from gptforge.config.parallel import ParallelConfig
from gptforge.config.train import TrainConfig

SECTIONS = {"model": ModelConfig, "train": TrainConfig, "parallel": ParallelConfig}


def _first_word(option: str) -> str:
    """An option name's first word: 'list' of 'list-gpus', 'train' of 'train.max_steps'."""
    return re.split(r"[-._]", option, maxsplit=1)[0]


def _nearest(bad: str, valid: list[str]) -> str | None:
    """The option name among `valid` closest to `bad` by difflib's ratio (a close one with the same
    first word preferred: --list-models -> --list-gpus, not --model); None when `bad` is itself
    valid (a hint never repeats the option typed) or nothing is close."""
    if bad in valid:
        return None
    close = difflib.get_close_matches(bad, valid, n=3, cutoff=0.5)
    same = [c for c in close if _first_word(c) == _first_word(bad)]
    return (same or close)[0] if close else None


def _value_after(option: str, argv: list[str]) -> str | None:
    """The argument that follows the last `option` in `argv`, or None."""
    found = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == option]
    return found[-1] if found else None


def _option_usage(message: str, argv: list[str]) -> str | None:
    """One line for argparse's errors about how an option was written, or None for others: a flag
    given a value (`--stop-at-eos=yes`), an option without its value (`--train.lr -inf`, where a
    value starting with '-' reads as an option)."""
    m = re.fullmatch(r"argument (--[\w.-]+): ignored explicit argument '(.*)'", message, re.S)
    if m:
        return f"{m[1]} is a flag and takes no value (got {m[1]}={m[2]}): write {m[1]} alone"
    m = re.fullmatch(r"argument (--[\w.-]+): expected (?:one|at least one) argument", message)
    if m:
        after = _value_after(m[1], argv)
        if after is not None and after.startswith("-") and not after.startswith("--"):
            return f"{m[1]} needs a value, and {after!r} reads as an option: write {m[1]}={after}"
        return f"{m[1]} needs a value"
    return None


def explain_unknown(message: str, sections: dict[str, type] = SECTIONS, options: list[str] | None = None,
                    argv: list[str] | None = None) -> str:
    """A jsonargparse error about an unknown option or key, or a misused option, as one line with
    a 'did you mean' hint.

    options: the command's own option names without the leading `--` (its parser's, sections'
    dotted keys included), so a hint names only an option that command takes; default: the
    dotted keys of `sections`. The hint is the closest name (`_nearest`), never the option typed
    itself. argv: the command line, for the value that followed an option (`_option_usage`).
    Unknown options: "unknown option --promt: did you mean --prompt?" (several: joined by '; ')."""
    valid = options if options is not None else [f"{s}.{f.name}" for s, cls in sections.items() for f in fields(cls)]
    usage = _option_usage(message, argv or [])
    if usage is not None:
        return usage
    hints = []
    m = re.fullmatch(r"unrecognized arguments: (.*)", message, re.S)
    if m:  # whole option names, hyphens included (--list-models, not --list), without a `=value`
        unknown = [(bad, _nearest(bad, valid)) for bad in (t[2:].split("=", 1)[0] for t in m[1].split()
                                                           if t.startswith("--"))]
        if any(near for _, near in unknown):
            return "; ".join(f"unknown option --{bad}" + (f": did you mean --{near}?" if near else "")
                             for bad, near in unknown)
    m = re.search(r"Option '(\w+)\.(\w+)' is not accepted", message)
    if m and m.group(1) not in sections:
        close = difflib.get_close_matches(m.group(1), list(sections), n=1, cutoff=0.5)
        if close:
            hints.append(f"unknown section {m.group(1)}: did you mean {close[0]}?")
    m = re.search(r"Group '(\w+)' does not accept (?:nested key|option) '(\w+)'", message)
    if m and m.group(1) in sections:
        names = [f.name for f in fields(sections[m.group(1)])]
        close = difflib.get_close_matches(m.group(2), names, n=1, cutoff=0.5)
        if close:
            hints.append(f"unknown key {m.group(1)}.{m.group(2)}: did you mean {m.group(1)}.{close[0]}?")
    return "; ".join([message, *hints])


@dataclass
class RunConfig:
    """Everything a `pretrain` run needs; saved as RUN_DIR/config.yaml."""

    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)


def describe_parse_error(message: str, argv: list[str], options: list[str] | None = None) -> str:
    """A parser's error as one line with hints: the nearest valid option or key (among `options`,
    the command's own; see `explain_unknown`), the recipe file it came from, `--model.preset` for
    `--model NAME`; a missing `--config` file as "--config FILE: no such file" (or "is a folder")."""
    message = " ".join(message.split())  # jsonargparse's and PyYAML's messages span lines
    recipes = [a.split("=", 1)[1] if a.startswith("--config=") else argv[i + 1] for i, a in enumerate(argv)
               if a.startswith("--config=") or (a == "--config" and i + 1 < len(argv))]
    if re.match(r'Parser key "config": (File does not exist|Path is not a file)', message):
        import os

        missing = [r for r in recipes if not os.path.isfile(r)]
        if missing:
            what = "is a folder, not a file" if os.path.isdir(missing[0]) else "no such file"
            return f"--config {missing[0]}: {what} (give a YAML recipe with one section per config group)"
    parts = [explain_unknown(message, options=options, argv=argv)]
    for recipe in recipes:
        if "<unicode string>" in parts[0]:
            parts[0] = parts[0].replace("<unicode string>", recipe)
        elif recipe not in parts[0]:
            parts.append(f"recipe: {recipe}")
    for i, a in enumerate(argv[:-1]):
        if a in ("--model", "--train", "--parallel") and not argv[i + 1].endswith((".yaml", ".yml", ".json")):
            parts.append(f"{a} takes a YAML file for that section; for a preset write --model.preset "
                         f"{argv[i + 1]}" if a == "--model" else f"{a} takes a YAML file for that section")
    return "; ".join(parts)


def run_config_from(init) -> RunConfig:
    """RunConfig from a namespace returned by `parse_args` (sections missing there take defaults)."""
    return RunConfig(**{k: getattr(init, k) for k in ("model", "train", "parallel") if hasattr(init, k)})
