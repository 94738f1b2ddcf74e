"""Structured output through the OpenAI client: response_format, vLLM's structured_outputs, parse()."""

from __future__ import annotations

import json
import re
from typing import Literal

import pytest

pytest.importorskip("llguidance", reason="llguidance is in the serve and test extras")

from tests.serve.test_engine_process import proc_engine  # noqa: E402, F401  (the fixture)

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["ok", "n"], "additionalProperties": False}
HI = [{"role": "user", "content": "JSON"}]


def test_json_schema_on_chat_parses_and_validates(client):
    import jsonschema

    r = client.chat.completions.create(
        model="tiny", messages=HI, max_tokens=40, temperature=0.8, seed=5, n=3,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}})
    for c in r.choices:
        assert c.finish_reason == "stop", c.message.content
        jsonschema.validate(json.loads(c.message.content), SCHEMA)
        assert c.message.content == json.dumps(json.loads(c.message.content), separators=(",", ":"))  # compact


def test_json_object_on_completions_and_streamed(client):
    r = client.completions.create(model="tiny", prompt="data = ", max_tokens=50, temperature=0,
                                  extra_body={"response_format": {"type": "json_object"}})
    c = r.choices[0]
    if c.finish_reason == "stop":
        assert isinstance(json.loads(c.text), dict)
    else:
        assert c.finish_reason == "length" and c.text.startswith("{")
    stream = client.completions.create(model="tiny", prompt="data = ", max_tokens=50, temperature=0, stream=True,
                                       extra_body={"response_format": {"type": "json_object"}})
    assert "".join(ch.choices[0].text for ch in stream) == c.text


def test_chat_completions_parse_returns_the_object(client):
    from pydantic import BaseModel

    class Verdict(BaseModel):
        ok: bool
        colour: Literal["red", "green", "蓝"]

    r = client.chat.completions.parse(model="tiny", messages=HI, max_tokens=40, temperature=0,
                                      response_format=Verdict)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Verdict) and parsed.colour in ("red", "green", "蓝")


def test_structured_outputs_choice_regex_grammar_json(client):
    def chat(so, **kw):
        return client.chat.completions.create(model="tiny", messages=HI, max_tokens=30, temperature=1.0, seed=2,
                                              extra_body={"structured_outputs": so}, **kw).choices[0]

    assert chat({"choice": ["是", "否", "maybe 🤔"]}).message.content in ("是", "否", "maybe 🤔")
    c = chat({"regex": r"[A-Z][a-z]{2,5} [0-9]{2}"})
    assert re.fullmatch(r"[A-Z][a-z]{2,5} [0-9]{2}", c.message.content) and c.finish_reason == "stop"
    c = chat({"grammar": 'root ::= "yes" | "no" | "(" [0-9] ")"'})
    assert re.fullmatch(r"yes|no|\([0-9]\)", c.message.content)
    c = chat({"json": json.dumps(SCHEMA)})
    assert set(json.loads(c.message.content)) == {"ok", "n"}
    stream = client.chat.completions.create(model="tiny", messages=HI, max_tokens=30, temperature=1.0, seed=2,
                                            stream=True, extra_body={"structured_outputs": {"choice": ["是", "否"]}})
    chunks = list(stream)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) in ("是", "否")
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("extra, param", [
    ({"structured_outputs": {"regex": "a(b"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"json": {"type": "nonsense"}}}, "structured_outputs.json"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
    ({"structured_outputs": {"grammar": "start: missing_rule"}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"regex": "(a{1000}){1000}"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs.choice"),
    ({"structured_outputs": {"schema": {}}}, "structured_outputs.schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer",
                                                                                           "minimum": "a"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "structured_outputs.regex"),
    ({"response_format": {"type": "json_object"}, "stop": ["}"]}, "stop"),
])
def test_bad_constraints_are_400_naming_the_field(client, extra, param):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=HI, max_tokens=5, extra_body=extra)
    assert e.value.body["param"] == param, e.value.body
    assert e.value.body["message"].startswith(param) or param == "stop" or "unrecognized" in e.value.body["message"]


def test_text_format_is_free_output(client):
    a = client.chat.completions.create(model="tiny", messages=HI, max_tokens=8, temperature=0,
                                       response_format={"type": "text"})
    b = client.chat.completions.create(model="tiny", messages=HI, max_tokens=8, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_the_engine_process_follows_grammars_and_fails_a_bad_one_alone(trained, proc_engine):  # noqa: F811
    from gptforge.infer.engine import SamplingParams
    from gptforge.infer.grammar import choice_grammar
    from tests.serve.test_engine_process import Collector

    _model, tok = trained
    got = Collector(3)
    prompt = tok.encode("x = ")
    proc_engine.submit(prompt, SamplingParams(max_tokens=20, temperature=1.0, seed=1,
                                              grammar=choice_grammar(["北京", "Paris"], "c")), got.sink(0))
    proc_engine.submit(prompt, SamplingParams(max_tokens=20, grammar="start: nowhere"), got.sink(1))
    proc_engine.submit(prompt, SamplingParams(max_tokens=4, temperature=0), got.sink(2))
    got.wait()
    assert "".join(e.text for e in got.events[0]) in ("北京", "Paris") and got.events[0][-1].finish_reason == "stop"
    assert got.events[1][-1].finish_reason == "error" and "nowhere" in got.events[1][-1].error
    assert got.events[2][-1].finish_reason == "length"
