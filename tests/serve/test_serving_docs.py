"""The curl commands of docs/serving.md's "Structured output" and "Tool calls" sections, run as
written against a live server (only the address and the API key header changed)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.serve.test_tools import long_live  # noqa: F401  (the fixture)

pytest.importorskip("llguidance", reason="llguidance is in the serve and test extras")
DOC = Path(__file__).resolve().parents[2] / "docs" / "serving.md"


def doc_commands() -> list[str]:
    text = DOC.read_text()
    part = text[text.index("## Structured output"):]
    return [line for line in part.splitlines() if line.startswith("curl -s http://127.0.0.1:8000/")]


def test_the_documented_commands_give_what_they_promise(long_live):  # noqa: F811
    import jsonschema

    from tests.serve.conftest import API_KEY

    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    commands = doc_commands()
    assert len(commands) == 5
    answers = []
    for cmd in commands:
        argv = shlex.split(cmd.replace("http://127.0.0.1:8000", long_live.url))
        argv[1:1] = ["-H", f"Authorization: Bearer {API_KEY}"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True).stdout
        answers.append(json.loads(out))
    for a in answers:
        assert "choices" in a, a
    city = answers[0]["choices"][0]
    body = json.loads(shlex.split(commands[0])[-1])
    if city["finish_reason"] == "stop":
        jsonschema.validate(json.loads(city["message"]["content"]),
                            body["response_format"]["json_schema"]["schema"])
    assert answers[1]["choices"][0]["text"] in ("yes", "no", "是", "否")
    assert re.fullmatch(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", answers[2]["choices"][0]["text"])
    assert re.fullmatch(r"[1-9]( \+ [1-9])*", answers[3]["choices"][0]["message"]["content"])
    tool = answers[4]["choices"][0]
    assert tool["finish_reason"] == "tool_calls"
    assert set(json.loads(tool["message"]["tool_calls"][0]["function"]["arguments"])) == {"city"}
