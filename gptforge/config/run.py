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


def explain_unknown(message: str, sections: dict[str, type] = SECTIONS, options: list[str] | None = None) -> str:
    """Add a 'did you mean' hint to a jsonargparse error about an unknown option or key.

    options: the command's own option names without the leading `--` (its parser's, sections'
    dotted keys included), so a hint names only an option that command takes; default: the
    dotted keys of `sections`. The hint is the closest name by difflib's ratio, a close one with
    the same first word preferred."""
    valid = options if options is not None else [f"{s}.{f.name}" for s, cls in sections.items() for f in fields(cls)]
    hints = []
    # Whole option names, hyphens included (--list-models, not --list), no trailing '.' or '-'.
    for bad in re.findall(r"--([A-Za-z_](?:[\w.-]*\w)?)", message):
        close = difflib.get_close_matches(bad, valid, n=3, cutoff=0.5)
        # A candidate with the same first word wins (--list-models: --list-gpus, not --model).
        same = [c for c in close if _first_word(c) == _first_word(bad)]
        if close:
            hints.append(f"unknown option --{bad}: did you mean --{(same or close)[0]}?")
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
    return message + ("\n" + "\n".join(hints) if hints else "")


@dataclass
class RunConfig:
    """Everything a `pretrain` run needs; saved as RUN_DIR/config.yaml."""

    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)


def describe_parse_error(message: str, argv: list[str], options: list[str] | None = None) -> str:
    """A parser's error with hints: the nearest valid option or key (among `options`, the
    command's own; see `explain_unknown`), the recipe file it came from, and `--model.preset` for
    `--model NAME`."""
    message = explain_unknown(message, options=options)
    for i, a in enumerate(argv[:-1]):
        if a == "--config" and "<unicode string>" in message:
            message = message.replace("<unicode string>", argv[i + 1])
        elif a == "--config" and argv[i + 1] not in message:
            message += f"\n(recipe: {argv[i + 1]})"
        if a in ("--model", "--train", "--parallel") and not argv[i + 1].endswith((".yaml", ".yml", ".json")):
            message += (f"\n{a} takes a YAML file for that section; for a preset write --model.preset "
                        f"{argv[i + 1]}" if a == "--model" else f"\n{a} takes a YAML file for that section")
    return message


def run_config_from(init) -> RunConfig:
    """RunConfig from a namespace returned by `parse_args` (sections missing there take defaults)."""
    return RunConfig(**{k: getattr(init, k) for k in ("model", "train", "parallel") if hasattr(init, k)})
