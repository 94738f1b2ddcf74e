"""Tools and tool calls in the default chat template: tool-free conversations render as before,
Python and Jinja (and transformers) agree with tools, and fine-tuning trains the calls."""

from __future__ import annotations

import pytest

from gptforge.data.chat import default_chat_template, prompt_ids, render_default, render_example
from tests.data.test_instruct import CONVO, _decode_targets, train_tokenizer

# The default template as it was before tools (gptforge 0.x, exported into many runs' folders).
BEFORE_TOOLS = ("{% set headers = {'system': '### System:\\n', 'user': '### User:\\n', 'assistant': "
                "'### Assistant:\\n'} %}{% for message in messages %}{{ headers[message['role']] + "
                "message['content'] }}{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
                "{{ '\\n\\n' }}{% endfor %}{% if add_generation_prompt %}{{ headers['assistant'] }}{% endif %}")

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "天气 of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CALLING = [{"role": "user", "content": "Weather in 北京?"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "北京"}}}]},
           {"role": "tool", "tool_call_id": "c1", "content": "晴 21°C"},
           {"role": "assistant", "content": "Sunny, 21°C."}]


@pytest.mark.parametrize("generation", [False, True])
def test_tool_free_conversations_render_byte_identical(tmp_path, generation):
    from gptforge.data.chat import _jinja_env

    env = _jinja_env()
    for add_bos in (False, True):
        new = env.from_string(default_chat_template(add_bos)).render(
            messages=CONVO, add_generation_prompt=generation, eos_token="<E>", bos_token="<B>")
        old = env.from_string(("{{ bos_token }}" if add_bos else "") + BEFORE_TOOLS).render(
            messages=CONVO, add_generation_prompt=generation, eos_token="<E>", bos_token="<B>")
        assert new == old


def test_tools_render_alike_in_python_jinja_and_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    tok = train_tokenizer(tmp_path, specials=("<|endoftext|>",))
    ref = render_default(tok, CALLING, add_generation_prompt=True, tools=TOOLS)
    text = tok.tokenizer.decode(ref.ids, skip_special_tokens=False)
    assert text.startswith("### Tools:\n") and '"description": "天气 of a city"' in text
    assert ('### Assistant:\n<tool_call>{"name":"get_weather","arguments":{"city":"北京"}}</tool_call><|endoftext|>'
            in text)
    assert "### Tool:\n晴 21°C\n\n" in text and text.endswith("### Assistant:\n")
    tok.chat_template = default_chat_template()
    assert prompt_ids(tok, CALLING, tools=TOOLS) == ref.ids  # the Jinja path
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"),
                                              eos_token="<|endoftext|>")
    hf.chat_template = default_chat_template()
    rendered = hf.apply_chat_template(CALLING, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert hf(rendered, add_special_tokens=False)["input_ids"] == ref.ids


@pytest.mark.parametrize("jinja", [False, True])
def test_finetuning_rows_train_calls_not_tool_results(tmp_path, jinja):
    tok = train_tokenizer(tmp_path, specials=("<|endoftext|>",))
    if jinja:
        tok.chat_template = default_chat_template()
    ex = render_example(tok, {"messages": CALLING, "tools": TOOLS})
    assert _decode_targets(tok, ex) == [
        '<tool_call>{"name":"get_weather","arguments":{"city":"北京"}}</tool_call><|endoftext|>',
        "Sunny, 21°C.<|endoftext|>"]
    string_args = [dict(m) for m in CALLING]
    string_args[1] = {"role": "assistant", "tool_calls": [{"function": {"name": "get_weather",
                                                                        "arguments": '{"city":"北京"}'}}]}
    assert render_example(tok, {"messages": string_args, "tools": TOOLS}).ids == ex.ids


@pytest.mark.parametrize("row, msg", [
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}, {"role": "assistant", "content": "y"}]},
     "on an assistant message"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None,
                                                      "tool_calls": [{"function": {"arguments": "{}"}}]}]},
     r"messages\[1\].tool_calls\[0\]: a tool call needs a function name"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "tools": "f"},
     "`tools` must be a list"),
])
def test_bad_tool_rows_are_named(tmp_path, row, msg):
    tok = train_tokenizer(tmp_path, specials=("<|endoftext|>",))
    with pytest.raises(ValueError, match=msg):
        render_example(tok, row, where="f.jsonl:3")
