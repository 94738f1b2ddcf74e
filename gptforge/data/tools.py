"""Tool calls in gptforge's default chat template: how tools, calls and results are written.

A conversation with `tools` (OpenAI's `[{"type": "function", "function": {"name", "description",
"parameters"}}]`) starts with a tools turn; an assistant turn writes each of its calls after its
content as one line of compact JSON in tags; a tool result is a turn of its own:

    ### Tools:\\n{TOOLS_INSTRUCTION}\\n{tool 1 as JSON}\\n{tool 2 as JSON}\\n\\n
    ### Assistant:\\n{content}<tool_call>{"name":"f","arguments":{...}}</tool_call><EOS>\\n\\n
    ### Tool:\\n{result}\\n\\n

Tools are written as Jinja's `tojson` writes them (`json.dumps`, ", " and ": " separators, no
ASCII escaping); a call's arguments given as a JSON string are written as they are, given as an
object in compact JSON. A conversation without tools and calls renders exactly as before tools
existed. `default_chat_template` writes the same text in Jinja, so transformers'
`apply_chat_template(messages, tools=tools)` gives the same ids as `render_default`.
"""

from __future__ import annotations

import json
from typing import Any

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOLS_HEADER = "### Tools:\n"
TOOLS_INSTRUCTION = ('To call a function, answer with <tool_call>{"name": <function name>, "arguments": '
                     '<arguments object>}</tool_call>, once per call. The functions:')


def tools_text(tools: list[dict]) -> str:
    """The tools turn of `tools` (without the turn separator)."""
    return TOOLS_HEADER + TOOLS_INSTRUCTION + "\n" + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)


def call_function(call: dict) -> dict:
    """The {name, arguments} of one call given as OpenAI's {"function": {...}} or bare."""
    f = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(f, dict) or not isinstance(f.get("name"), str):
        raise ValueError(f"a tool call needs a function name, got {call!r:.120}")
    return f


def call_text(call: dict) -> str:
    """One call as the assistant writes it: <tool_call>{"name":...,"arguments":...}</tool_call>."""
    f = call_function(call)
    args: Any = f.get("arguments", {})
    args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False, separators=(",", ":"))
    return f'{TOOL_CALL_OPEN}{{"name":{json.dumps(f["name"], ensure_ascii=False)},"arguments":{args}}}{TOOL_CALL_CLOSE}'


def calls_text(calls: list[dict] | None) -> str:
    """Every call of an assistant turn, one after another."""
    return "".join(call_text(c) for c in calls or [])


JINJA_TOOLS = ("{% if tools %}{{ '" + TOOLS_HEADER.replace("\n", "\\n") + "' + '" + TOOLS_INSTRUCTION + "' }}"
               "{% for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}{{ '\\n\\n' }}{% endif %}")
"""The tools turn in Jinja (as `tools_text` plus the turn separator)."""

JINJA_CALLS = ("{% for tc in message['tool_calls'] or [] %}{% set f = tc['function'] if tc['function'] is defined "
               "else tc %}{{ '" + TOOL_CALL_OPEN + "{\"name\":' + (f['name'] | tojson) + ',\"arguments\":' }}"
               "{% if f['arguments'] is string %}{{ f['arguments'] }}{% else %}"
               "{{ f['arguments'] | tojson(separators=(',', ':')) }}{% endif %}{{ '}" + TOOL_CALL_CLOSE + "' }}"
               "{% endfor %}")
"""An assistant message's calls in Jinja (as `calls_text`)."""
