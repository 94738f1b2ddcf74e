"""Tool calls through the OpenAI client: tools, tool_choice, tool_calls (whole and streamed), role tool."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llguidance", reason="llguidance is in the serve and test extras")

WEATHER = {"type": "function", "function": {"name": "weather", "description": "天气 in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "北京"]},
                                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "clock", "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "w?"}]


@pytest.fixture(scope="module")
def long_live(tokenizer_file):
    """A server over a random 2-layer GPT of context 1024 with the test tokenizer (the tools turn
    alone is hundreds of its tokens); forced calls are constrained, so random weights suffice."""
    import torch

    from gptforge.config import ModelConfig
    from gptforge.model.gpt import GPT
    from gptforge.serve.app import ServeConfig, create_app
    from tests.serve.conftest import API_KEY, LiveServer

    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=2, n_head=2, d_model=32, block_size=1024, vocab_size=384).resolved()).eval()
    with LiveServer(create_app(model, tokenizer_file, ServeConfig(model_name="tiny", api_key=API_KEY))) as srv:
        yield srv


@pytest.fixture
def client(long_live):
    import openai

    from tests.serve.conftest import API_KEY

    c = openai.OpenAI(base_url=long_live.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    yield c
    c.close()


def test_required_and_named_calls_follow_the_schema(client):
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER, CLOCK], tool_choice="required",
                                       max_tokens=150, temperature=1.0, seed=4, n=2)
    for c in r.choices:
        assert c.finish_reason == "tool_calls" and c.message.content is None
        (call,) = c.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        args = json.loads(call.function.arguments)
        assert call.function.name in ("weather", "clock")
        if call.function.name == "weather":
            assert args["city"] in ("Paris", "北京") and 1 <= args["days"] <= 7
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER, CLOCK], max_tokens=150,
                                       tool_choice={"type": "function", "function": {"name": "weather"}}, temperature=0)
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "weather" and set(json.loads(call.function.arguments)) == {"city", "days"}


def test_streamed_call_arrives_whole_and_the_conversation_goes_on(client):
    kw = dict(model="tiny", tools=[WEATHER], max_tokens=150, temperature=0,
              tool_choice={"type": "function", "function": {"name": "weather"}})
    whole = client.chat.completions.create(messages=ASK, **kw).choices[0]
    chunks = list(client.chat.completions.create(messages=ASK, stream=True, **kw))
    deltas = [ch.choices[0].delta for ch in chunks]
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].function.name == "weather"
    assert calls[0].function.arguments == whole.message.tool_calls[0].function.arguments
    assert not "".join(d.content or "" for d in deltas)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # the call and its result go back as the next turn's history (role tool)
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [whole.message.tool_calls[0].model_dump()]},
                     {"role": "tool", "tool_call_id": whole.message.tool_calls[0].id, "content": "晴 21°C"}]
    r = client.chat.completions.create(model="tiny", messages=history, tools=[WEATHER], tool_choice="none",
                                       max_tokens=4, temperature=0)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason in ("stop", "length")


def test_server_renders_tools_and_history_with_the_template(long_live):
    from gptforge.data.chat import render_default
    from gptforge.serve.protocol import ChatRequest

    req = ChatRequest.model_validate({"messages": ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Paris","days":2}'}}]},
        {"role": "tool", "tool_call_id": "c", "content": "rain"}], "tools": [WEATHER]})
    srv = long_live.app.state.server
    from gptforge.serve.tools import tool_dicts

    ids = srv.chat_ids(req.messages, tools=tool_dicts(req))
    text = srv.chat.tokenizer.decode(ids, skip_special_tokens=False)
    assert '<tool_call>{"name":"weather","arguments":{"city":"Paris","days":2}}</tool_call>' in text
    assert "### Tool:\nrain" in text and '"name": "weather"' in text
    expected = render_default(srv.chat, [
        {"role": "user", "content": "w?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "weather",
                                                                           "arguments": '{"city":"Paris","days":2}'}}]},
        {"role": "tool", "content": "rain"}], add_generation_prompt=True, tools=tool_dicts(req)).ids
    assert ids == expected


@pytest.mark.parametrize("extra, param", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [CLOCK, CLOCK]}, "tools[1].function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [CLOCK], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": "low"}}}}}], "tool_choice": "required"}, "tools"),
    ({"tools": [CLOCK], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tools"),
])
def test_bad_tools_are_400_naming_the_field(client, extra, param):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=ASK, max_tokens=5, extra_body=extra)
    assert e.value.body["param"] == param, e.value.body


def test_parse_calls_and_call_stream():
    from gptforge.serve.tools import CallStream, parse_calls

    content, calls = parse_calls('Sure. <tool_call>{"name":"f","arguments":{"a":[1, 2]}}</tool_call>'
                                 '<tool_call>{"name":"g"}</tool_call><tool_call>not json</tool_call>')
    assert content == "Sure. <tool_call>not json</tool_call>"
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("f", '{"a":[1,2]}'), ("g", "{}")]
    assert parse_calls("plain <tool text") == ("plain <tool text", [])
    s = CallStream()
    out = [s.push(p) for p in ["Hi <", "b> <tool", "_call>{\"name\":\"f\",", "\"arguments\":{}}</tool_call>"]]
    assert out == ["Hi ", "<b> ", "", ""]
    text, calls = s.finish()
    assert text == "" and [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("f", "{}")]
