"""Structured output in the server: `response_format` and `structured_outputs` -> one grammar per
request, compiled and checked before the request is admitted, set on every job's SamplingParams.

A request names at most one constraint. A schema, regex or grammar that does not compile, or that
is over the size and work limits of `gptforge.infer.grammar`, is a 400 naming the field. Stop
strings are refused beside a constraint (a stop string could cut the output short of what the
grammar requires); the grammar itself ends the answer, with finish_reason "stop". An answer cut by
max_tokens ends with finish_reason "length" and may be incomplete JSON.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gptforge.infer.grammar import (
    GrammarError,
    GrammarVocab,
    any_json_object_grammar,
    check_grammar,
    choice_grammar,
    json_schema_grammar,
    lark_grammar,
    regex_grammar,
)
from gptforge.serve.protocol import APIError
from gptforge.serve.tools import forced_grammar


def request_grammar(req) -> tuple[str, str] | None:
    """(llguidance grammar, the request field it came from) of `req`'s response_format or
    structured_outputs, or None when the output is free.

    Raises:
        GrammarError: more than one constraint, or one that cannot be turned into a grammar.
    """
    found: list[tuple[str, str]] = []
    rf = getattr(req, "response_format", None)
    if rf is not None and rf.type == "json_object":
        found.append((any_json_object_grammar(), "response_format"))
    elif rf is not None and rf.type == "json_schema":
        if rf.json_schema is None:
            raise GrammarError("response_format.json_schema", "is required when type is json_schema")
        field = "response_format.json_schema.schema"
        found.append((json_schema_grammar(rf.json_schema.schema_, field), field))
    so = getattr(req, "structured_outputs", None)
    if so is not None:
        found += _structured_outputs(so)
    if getattr(req, "tools", None):
        call = forced_grammar(req)
        found += [call] if call else []
    if len(found) > 1:
        raise GrammarError(found[1][1], f"give one constraint; this request also has {found[0][1]}")
    return found[0] if found else None


def _structured_outputs(so) -> list[tuple[str, str]]:
    found = []
    if so.json_ is not None:
        schema: Any = so.json_
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise GrammarError("structured_outputs.json", f"is not valid JSON ({e})") from None
        found.append((json_schema_grammar(schema, "structured_outputs.json"), "structured_outputs.json"))
    if so.regex is not None:
        found.append((regex_grammar(so.regex, "structured_outputs.regex"), "structured_outputs.regex"))
    if so.choice is not None:
        found.append((choice_grammar(so.choice, "structured_outputs.choice"), "structured_outputs.choice"))
    if so.grammar is not None:
        found.append((lark_grammar(so.grammar, "structured_outputs.grammar"), "structured_outputs.grammar"))
    if so.json_object:
        found.append((any_json_object_grammar(), "structured_outputs.json_object"))
    return found


async def constrain(vocab: GrammarVocab, req, jobs: list) -> None:
    """Set the grammar of `req` (if any) on every job's SamplingParams, after compiling it once
    against `vocab` off the event loop.

    Raises:
        APIError: 400 naming the field for a constraint that does not compile or is over the limits,
            for two constraints, or for stop strings beside one.
    """
    try:
        found = request_grammar(req)
        if found is None:
            return
        grammar, field = found
        await asyncio.to_thread(check_grammar, vocab, grammar, field)
    except ImportError:
        raise APIError(400, f"{field} needs the grammar engine llguidance on the server: pip install 'gptforge[serve]'",
                       field, "unsupported_parameter") from None
    except GrammarError as e:
        raise APIError(400, f"{e.field}: {e.message}", e.field, "invalid_value") from None
    if req.stop:
        raise APIError(400, f"stop strings cannot be combined with {field}: a stop string could cut the output "
                            "short of what it requires (the constraint ends the answer itself); drop `stop`",
                       "stop", "invalid_value")
    for _prompt, params in jobs:
        params.grammar = grammar
