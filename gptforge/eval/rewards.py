"""Verifiable rewards: a program scores a completion, for `gptforge rl` (and any scorer of samples).

A reward is named by a spec string:
- `exact`: 1.0 when the completion's final answer (`gptforge.eval.answers.extract_answer`: after
  `####`, `答案：` / `Answer:`, `\\boxed{}`, else the last number) equals the row's `answer` after
  normalisation (`answers_match`), else 0.0. The same extraction `evaluate --chat` scores with.
- `regex:PATTERN`: 1.0 when the Python regular expression PATTERN matches somewhere in the
  completion (`re.search`; anchor it with `^...$` and add `(?s)` to match the whole text), else 0.0.
- `json_schema:FILE`: 1.0 when the completion (surrounding whitespace and a Markdown ```json fence
  removed) is JSON that validates against the JSON Schema in FILE (the `jsonschema` package,
  `pip install 'gptforge[rl]'`), else 0.0.
- `python:FILE:FUNCTION`: FUNCTION(prompt, completion, row) from the Python file FILE, returning a
  number (bool counts as 0/1); prompt is the row's `prompt`, or for a `messages` row the content of
  its last user message; row is the whole JSON row, so other columns reach the function.

Several rewards with weights come from a YAML file (`load_rewards_file`):

    rewards:
      - reward: exact
        weight: 1.0
      - reward: "regex:^<answer>.*</answer>$"
        weight: 0.2

and the total is the weighted sum, sum_i w_i * r_i. Relative FILE paths in the YAML are read
against the YAML file's folder.

Errors are one line (`InputError`): a bad spec, a missing file or function, a schema that is not
a JSON Schema, a row without a field a reward needs (`check_row`), a reward function that raises or
returns something that is not a finite number (`RewardError`, naming the row and the function).
"""

from __future__ import annotations

import importlib.util
import json
import math
import numbers
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptforge.errors import InputError
from gptforge.eval.answers import answers_match, extract_answer

RewardFn = Callable[[str, str, dict], float]
SPEC_HELP = "exact, regex:PATTERN, json_schema:FILE or python:FILE:FUNCTION"


class RewardError(InputError):
    """A reward function failed on a row (raised, or returned a non-number); the message names both."""


@dataclass(frozen=True)
class Reward:
    """One reward: its spec (`name`, also its metric name), weight, function and required row fields.

    fn(prompt, completion, row) -> float; `needs` lists the row fields fn reads (e.g. ("answer",)).
    """

    name: str
    fn: RewardFn
    weight: float = 1.0
    needs: tuple[str, ...] = ()


def exact_reward(prompt: str, completion: str, row: dict) -> float:
    """1.0 when the final answer of `completion` matches `row["answer"]` (see the module docstring)."""
    return 1.0 if answers_match(extract_answer(completion), str(row["answer"])) else 0.0


def regex_reward(pattern: str) -> RewardFn:
    """A reward that is 1.0 when `pattern` matches somewhere in the completion (re.search), else 0.0.

    Raises:
        InputError: the pattern does not compile.
    """
    try:
        compiled = re.compile(pattern)
    except re.error as e:
        raise InputError(f"--reward regex:{pattern}: not a valid regular expression ({e})") from None

    def regex(prompt: str, completion: str, row: dict) -> float:
        return 1.0 if compiled.search(completion) else 0.0

    return regex


_FENCE = re.compile(r"^```(?:json)?\s*\n(.*?)\n?```$", re.DOTALL)


def json_schema_reward(path: str | Path) -> RewardFn:
    """A reward that is 1.0 when the completion is JSON valid under the JSON Schema in `path`.

    Raises:
        InputError: no such file, not JSON, not a valid JSON Schema, or `jsonschema` not installed.
    """
    from gptforge.errors import require_extra

    require_extra("--reward json_schema", "rl", {"jsonschema": "jsonschema"})
    import jsonschema

    path = Path(path)
    if not path.is_file():
        raise InputError(f"--reward json_schema:{path}: no such file; give a JSON Schema file")
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
        validator_cls = jsonschema.validators.validator_for(schema)
        validator_cls.check_schema(schema)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"--reward json_schema:{path}: not a JSON file ({e})") from None
    except jsonschema.SchemaError as e:
        raise InputError(f"--reward json_schema:{path}: not a valid JSON Schema ({e.message})") from None
    validator = validator_cls(schema)

    def json_schema(prompt: str, completion: str, row: dict) -> float:
        text = completion.strip()
        fenced = _FENCE.match(text)
        if fenced:
            text = fenced.group(1).strip()
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return 0.0
        return 1.0 if validator.is_valid(value) else 0.0

    return json_schema


def python_reward(path: str | Path, function: str) -> RewardFn:
    """FUNCTION from the Python file `path`, called as function(prompt, completion, row).

    Raises:
        InputError: no such file, the file fails to import, or it has no callable `function`.
    """
    path = Path(path)
    where = f"--reward python:{path}:{function}"
    if not path.is_file():
        raise InputError(f"{where}: no such file {path}; give a Python file defining {function}(prompt, completion, row)")
    spec = importlib.util.spec_from_file_location(f"gptforge_reward_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise InputError(f"{where}: not a Python file (name it *.py)")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - any failure of the user's file is reported in one line
        raise InputError(f"{where}: importing {path} failed: {type(e).__name__}: {e}") from None
    fn = getattr(module, function, None)
    if not callable(fn):
        defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise InputError(f"{where}: {path} defines no function {function!r} (it defines: "
                         f"{', '.join(defined) or 'none'})")
    return fn


def parse_reward(spec: str, weight: float = 1.0, base_dir: Path | None = None) -> Reward:
    """A `Reward` from a spec string (see the module docstring); relative files are read against
    `base_dir` (default: the working directory).

    Raises:
        InputError: an unknown kind, an empty pattern/path, or any error of the kind's loader.
    """
    def resolve(p: str) -> Path:
        return base_dir / p if base_dir is not None and not Path(p).is_absolute() else Path(p)

    kind, _, rest = spec.partition(":")
    if spec == "exact":
        return Reward(spec, exact_reward, weight, ("answer",))
    if kind == "regex" and rest:
        return Reward(spec, regex_reward(rest), weight)
    if kind == "json_schema" and rest:
        return Reward(spec, json_schema_reward(resolve(rest)), weight)
    if kind == "python" and ":" in rest:
        file, function = rest.rsplit(":", 1)
        if file and function:
            return Reward(spec, python_reward(resolve(file), function), weight)
    raise InputError(f"--reward {spec!r}: not a reward; give {SPEC_HELP}")


def load_rewards_file(path: str | Path) -> list[Reward]:
    """Rewards with weights from a YAML file (`rewards:` list of {reward, weight}; see the module
    docstring).

    Raises:
        InputError: no file, not YAML, no list, an entry without `reward`, an unknown key, a weight
            that is not a finite number, or a bad spec.
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise InputError(f"--rl.rewards {path}: no such file; give a YAML file with a `rewards:` list")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise InputError(f"--rl.rewards {path}: not a YAML file ({str(e).splitlines()[0]})") from None
    entries = data.get("rewards") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        raise InputError(f"--rl.rewards {path}: expected `rewards:` with a list of {{reward: SPEC, weight: W}}")
    rewards: list[Reward] = []
    for i, entry in enumerate(entries):
        where = f"--rl.rewards {path}: rewards[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("reward"), str):
            raise InputError(f"{where}: expected {{reward: SPEC, weight: W}} with SPEC one of {SPEC_HELP}")
        unknown = sorted(set(entry) - {"reward", "weight"})
        if unknown:
            raise InputError(f"{where}: unknown key {unknown[0]!r}; the keys are reward and weight")
        weight = entry.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise InputError(f"{where}: weight must be a finite number, got {weight!r}")
        if any(r.name == entry["reward"] for r in rewards):
            raise InputError(f"{where}: reward {entry['reward']!r} is listed twice; give each once with its weight")
        rewards.append(parse_reward(entry["reward"], float(weight), path.parent))
    return rewards


def check_row(rewards: Sequence[Reward], row: dict, where: str) -> None:
    """Refuse a row that lacks a field a reward reads.

    Raises:
        InputError: "<where>: reward <name> needs the field <f>; this row has <fields>".
    """
    for r in rewards:
        for f in r.needs:
            if f not in row:
                raise InputError(f"{where}: reward {r.name} needs the field {f!r}; this row has {sorted(row)}")


def score(rewards: Sequence[Reward], prompt: str, completion: str, row: dict, where: str) -> dict[str, float]:
    """Every reward of one completion, and their weighted sum.

    Returns: {reward name: value, ..., "reward": sum_i weight_i * value_i}.

    Raises:
        RewardError: a reward function raised or returned something that is not a finite number
            (bool counts as 0/1), naming `where` (the row) and the reward.
    """
    out: dict[str, float] = {}
    total = 0.0
    for r in rewards:
        try:
            value: Any = r.fn(prompt, completion, row)
        except Exception as e:  # noqa: BLE001 - the user's function: report which row and function
            raise RewardError(f"{where}: reward {r.name} raised {type(e).__name__}: {e}") from None
        if isinstance(value, bool):
            value = float(value)
        if not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise RewardError(f"{where}: reward {r.name} returned {value!r:.80}; a reward must return a finite "
                              "number (int, float or bool)")
        out[r.name] = float(value)
        total += r.weight * float(value)
    out["reward"] = total
    return out
