"""Verifiable rewards (exact, regex, json_schema, python, weighted YAML) and prompt rows for RL."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from gptforge.data.chat import prompt_ids
from gptforge.errors import InputError
from gptforge.eval.prompts import read_prompts, render_prompt
from gptforge.eval.rewards import RewardError, check_row, load_rewards_file, parse_reward, score

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from test_instruct import CHATML, train_tokenizer  # noqa: E402


def _one(spec: str, completion: str, row: dict | None = None, **kw) -> float:
    return parse_reward(spec, **kw).fn("p", completion, row or {})


@pytest.mark.parametrize("completion, answer, expected", [
    ("She has 3 + 4 = 7 apples.\n#### 7", "7", 1.0),
    ("#### 8", "7", 0.0),
    ("The answer is $1,234.00.", "Natalia sold 1234 clips.\n#### 1,234", 1.0),
    ("答案：3.50元", "3.5", 1.0),
    ("no number here", "7", 0.0),
    ("first 7 then 9", "7", 0.0),  # the last number counts
])
def test_exact_reward_uses_shared_answer_extraction(completion, answer, expected):
    assert _one("exact", completion, {"answer": answer}) == expected


def test_regex_reward_searches_and_bad_pattern_is_one_line():
    assert _one("regex:<answer>\\d+</answer>", "think... <answer>12</answer>") == 1.0
    assert _one("regex:^<answer>", "x <answer>") == 0.0
    with pytest.raises(InputError, match=r"regex:\(unclosed: not a valid regular expression"):
        parse_reward("regex:(unclosed")


def test_json_schema_reward(tmp_path):
    pytest.importorskip("jsonschema")
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}))
    spec = f"json_schema:{schema}"
    assert _one(spec, ' {"n": 3} ') == 1.0
    assert _one(spec, '```json\n{"n": 3}\n```') == 1.0
    assert _one(spec, '{"n": "three"}') == 0.0
    assert _one(spec, "not json") == 0.0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"type": "no-such-type"}))
    with pytest.raises(InputError, match="bad.json: not a valid JSON Schema"):
        parse_reward(f"json_schema:{bad}")
    with pytest.raises(InputError, match="missing.json: no such file"):
        parse_reward(f"json_schema:{tmp_path / 'missing.json'}")


def _reward_file(tmp_path: Path) -> Path:
    f = tmp_path / "my_rewards.py"
    f.write_text(
        "def length_bonus(prompt, completion, row):\n"
        "    return min(len(completion), row['cap']) / row['cap']\n"
        "def boom(prompt, completion, row):\n"
        "    raise KeyError('tests')\n"
        "def words(prompt, completion, row):\n"
        "    return 'yes'\n"
        "def nan(prompt, completion, row):\n"
        "    return float('nan')\n"
        "def flag(prompt, completion, row):\n"
        "    return prompt in completion\n")
    return f


def test_python_reward_gets_prompt_completion_and_row(tmp_path):
    f = _reward_file(tmp_path)
    assert _one(f"python:{f}:length_bonus", "abcd", {"cap": 8}) == 0.5
    r = parse_reward(f"python:{f}:flag")
    assert score([r], "q", "the q", {}, "rows.jsonl:1") == {r.name: 1.0, "reward": 1.0}


def test_python_reward_errors_name_row_and_function(tmp_path):
    f = _reward_file(tmp_path)
    with pytest.raises(InputError, match=r"defines no function 'missing' \(it defines: boom, flag, length_bonus"):
        parse_reward(f"python:{f}:missing")
    with pytest.raises(InputError, match="no such file .*nope.py; give a Python file"):
        parse_reward(f"python:{tmp_path / 'nope.py'}:f")
    for fn, message in [("boom", r"rows.jsonl:3: reward python:.*:boom raised KeyError"),
                        ("words", r"rows.jsonl:3: reward python:.*:words returned 'yes'; a reward must return"),
                        ("nan", r"rows.jsonl:3: reward python:.*:nan returned nan")]:
        r = parse_reward(f"python:{f}:{fn}")
        with pytest.raises(RewardError, match=message):
            score([r], "p", "c", {}, "rows.jsonl:3")


def test_unknown_spec_lists_the_kinds():
    with pytest.raises(InputError, match="not a reward; give exact, regex:PATTERN, json_schema:FILE or python:FILE"):
        parse_reward("exactly")
    with pytest.raises(InputError, match="not a reward"):
        parse_reward("python:only_a_file.py")


def test_weighted_rewards_from_yaml_with_relative_paths(tmp_path):
    _reward_file(tmp_path)
    y = tmp_path / "rewards.yaml"
    y.write_text("rewards:\n  - reward: exact\n    weight: 2.0\n"
                 "  - reward: python:my_rewards.py:length_bonus\n    weight: 0.5\n"
                 "  - reward: 'regex:^#'\n")
    rewards = load_rewards_file(y)
    assert [r.weight for r in rewards] == [2.0, 0.5, 1.0]
    out = score(rewards, "p", "#### 7", {"answer": "7", "cap": 12}, "r:1")
    assert out["exact"] == 1.0 and out["regex:^#"] == 1.0
    assert math.isclose(out["reward"], 2.0 * 1.0 + 0.5 * (6 / 12) + 1.0)


@pytest.mark.parametrize("text, message", [
    ("rewards:\n  - reward: exact\n    wieght: 2\n", "rewards\\[0\\]: unknown key 'wieght'"),
    ("rewards:\n  - reward: exact\n    weight: heavy\n", "weight must be a finite number"),
    ("rewards:\n  - reward: exact\n  - reward: exact\n", "'exact' is listed twice"),
    ("rewards: exact\n", "expected `rewards:` with a list"),
    ("rewards: [\n", "not a YAML file"),
])
def test_bad_rewards_yaml_is_one_line(tmp_path, text, message):
    y = tmp_path / "r.yaml"
    y.write_text(text)
    with pytest.raises(InputError, match=message):
        load_rewards_file(y)


def test_row_without_what_the_reward_needs():
    with pytest.raises(InputError, match="train.jsonl:4: reward exact needs the field 'answer'; this row has"):
        check_row([parse_reward("exact")], {"prompt": "2+2?"}, "train.jsonl:4")


@pytest.fixture(scope="module")
def chat_tok(tmp_path_factory):
    return train_tokenizer(tmp_path_factory.mktemp("tok"), chat_template=CHATML)


def test_prompt_rows_render_as_finetune_does(chat_tok, tmp_path):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}]
    f = tmp_path / "train.jsonl"
    f.write_text(json.dumps({"prompt": "2+3=", "answer": "5"}) + "\n\n"
                 + json.dumps({"messages": messages, "answer": "5", "id": "q2"}) + "\n")
    rows = read_prompts(f, chat_tok, [parse_reward("exact")])
    assert rows[0].ids == chat_tok.encode_text("2+3=") and rows[0].prompt == "2+3="
    assert rows[1].ids == prompt_ids(chat_tok, messages)
    assert chat_tok.tokenizer.decode(rows[1].ids, skip_special_tokens=False).endswith("<|im_start|>assistant\n")
    assert rows[1].prompt == "What is 2+3?" and rows[1].row["id"] == "q2" and rows[1].where == f"{f}:3"


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "2+2", "answer": 4', "train.jsonl:1: not valid JSON"),
    ('{"prompt": "2+2"}', "train.jsonl:1: reward exact needs the field 'answer'"),
    ('{"question": "2+2", "answer": "4"}', "train.jsonl:1: a prompt row needs a string `prompt` or a `messages`"),
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "4"}], "answer": "4"}',
     "train.jsonl:1: `messages` must be a non-empty conversation that ends before the assistant"),
    ('{"messages": [{"role": "robot", "content": "hi"}], "answer": "4"}', "train.jsonl:1: messages\\[0\\] must have"),
    ('{"prompt": "' + "word " * 80 + '", "answer": "4"}', "train.jsonl:1: the prompt has \\d+ tokens, more than the 16"),
])
def test_bad_prompt_rows_are_one_line(chat_tok, tmp_path, line, message):
    f = tmp_path / "train.jsonl"
    f.write_text(line + "\n")
    with pytest.raises(InputError, match=message):
        read_prompts(f, chat_tok, [parse_reward("exact")], max_prompt_tokens=16)


def test_empty_prompt_file_and_empty_prompt(chat_tok, tmp_path):
    f = tmp_path / "train.jsonl"
    f.write_text("\n")
    with pytest.raises(InputError, match="no prompt rows"):
        read_prompts(f, chat_tok)
    with pytest.raises(InputError, match="r:1: the prompt is empty"):
        render_prompt(chat_tok, {"prompt": ""}, "r:1")
