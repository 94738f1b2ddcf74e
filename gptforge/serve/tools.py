"""Tool calls in the chat endpoint: tools into the prompt, calls out of the answer.

The tools and earlier calls are rendered by the chat template (`gptforge.data.tools`: Hermes-style
`<tool_call>{"name":...,"arguments":{...}}</tool_call>` in the assistant's turn, results in a
`### Tool:` turn). With `tool_choice` "required" or a named function the answer is one call whose
name and arguments are constrained to the tools' schemas (`forced_grammar`, compiled by
gptforge.infer.grammar); with "auto" (the default when tools are given) the model writes text and
any calls freely, and every well-formed call in the answer is returned in `tool_calls` (with
finish_reason "tool_calls"); text outside the calls stays the content. With "none" the tools are
shown to the model but nothing is parsed. Streamed, the text before a call goes out as it comes;
from the first `<tool_call>` on, the answer is held back and its calls sent whole in one delta.
"""

from __future__ import annotations

import json
import re
import uuid

from gptforge.data.tools import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from gptforge.infer.grammar import JSON_OPTIONS, GrammarError, lark_grammar
from gptforge.serve.protocol import APIError

_CALL = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


def active(req) -> bool:
    """Whether answers of `req` are parsed for tool calls."""
    return bool(req.tools) and req.tool_choice != "none"


def check_tools(req) -> None:
    """Refuse tools and tool_choice that cannot work.

    Raises:
        APIError: 400 naming the field: a function's parameters that are not an object schema,
            two functions of one name, a tool_choice without tools or naming an unknown function; a
            `tool` message that does not follow an assistant message with tool_calls (or another
            tool message), as OpenAI refuses it.
    """
    before = None
    for i, m in enumerate(getattr(req, "messages", None) or []):
        answered = before is not None and (before.role == "tool" or (before.role == "assistant" and before.tool_calls))
        if m.role == "tool" and not answered:
            raise APIError(400, f"messages[{i}] has role 'tool' but does not answer the tool_calls of a preceding "
                                "assistant message", f"messages[{i}].role", "invalid_value")
        before = m
    names: set[str] = set()
    for i, t in enumerate(req.tools or []):
        params = t.function.parameters
        if params is not None and params.get("type", "object") != "object":
            raise APIError(400, f"tools[{i}].function.parameters must be a JSON schema of type object (the arguments "
                                f"are a JSON object), got type {params.get('type')!r}",
                           f"tools[{i}].function.parameters", "invalid_value")
        if t.function.name in names:
            raise APIError(400, f"tools[{i}].function.name {t.function.name!r} is given twice",
                           f"tools[{i}].function.name", "invalid_value")
        names.add(t.function.name)
    choice = req.tool_choice
    if choice is not None and choice != "none" and not req.tools:
        raise APIError(400, "tool_choice needs tools", "tool_choice", "invalid_value")
    if choice is not None and not isinstance(choice, str) and choice.function.name not in names:
        raise APIError(400, f"tool_choice names the function {choice.function.name!r}, which is not among the tools "
                            f"({', '.join(sorted(names))})", "tool_choice", "invalid_value")


def tool_dicts(req) -> list[dict] | None:
    """The request's tools as the chat template renders them (None without tools)."""
    return [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None


def message_dict(m) -> dict:
    """A request message as the chat template takes it: role, content (text) and any tool calls."""
    content = m.content
    if isinstance(content, list):
        content = "".join(p.text for p in content)
    out = {"role": "system" if m.role == "developer" else m.role, "content": content}
    if getattr(m, "tool_calls", None):
        out["tool_calls"] = [{"function": {"name": c.function.name, "arguments": c.function.arguments}}
                             for c in m.tool_calls]
    return out


def forced_grammar(req) -> tuple[str, str] | None:
    """(grammar, field) of one call to a required or named function, or None when calls are free.

    Raises:
        GrammarError: the grammar cannot be built (naming "tools").
    """
    choice = req.tool_choice
    if not req.tools or choice in (None, "none", "auto"):
        return None
    tools = req.tools if choice == "required" else [t for t in req.tools if t.function.name == choice.function.name]
    options = [{"type": "object", "properties": {
        "name": {"const": t.function.name},
        "arguments": t.function.parameters or {"type": "object", "properties": {}, "additionalProperties": False}},
        "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    schema = {"x-guidance": JSON_OPTIONS, "anyOf": options}
    text = f'start: "{TOOL_CALL_OPEN}" call "{TOOL_CALL_CLOSE}"\ncall: %json {json.dumps(schema, ensure_ascii=False)}'
    try:
        return lark_grammar(text, "tools"), "tools"
    except GrammarError:
        raise
    except ValueError as e:
        raise GrammarError("tools", str(e)) from None


def parse_calls(text: str) -> tuple[str | None, list[dict]]:
    """(content, calls) of an answer: every `<tool_call>` holding a JSON object with a string `name`
    becomes an OpenAI tool call (arguments as compact JSON text); the rest of the text, stripped, is
    the content (None when empty and there are calls)."""
    calls: list[dict] = []

    def take(m: re.Match) -> str:
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            return m.group(0)
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return m.group(0)
        args = json.dumps(obj.get("arguments", {}), ensure_ascii=False, separators=(",", ":"))
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": obj["name"], "arguments": args}})
        return ""

    rest = _CALL.sub(take, text)
    if not calls:
        return text, []
    return (rest.strip() or None), calls


class CallStream:
    """One streamed choice's text with tool calls held back: `push` returns the text that can go
    out now (everything before a possible `<tool_call>`); `finish` parses what was held."""

    def __init__(self):
        self.held = ""
        self.calling = False

    def push(self, text: str) -> str:
        if self.calling:
            self.held += text
            return ""
        buf = self.held + text
        at = buf.find(TOOL_CALL_OPEN)
        if at >= 0:
            self.calling, self.held = True, buf[at:]
            return buf[:at]
        keep = next((k for k in range(min(len(buf), len(TOOL_CALL_OPEN) - 1), 0, -1)
                     if TOOL_CALL_OPEN.startswith(buf[-k:])), 0)
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]

    def finish(self) -> tuple[str, list[dict]]:
        """(text still to send, calls) at the end of the answer."""
        content, calls = parse_calls(self.held)
        self.held = ""
        return content or "", calls
