"""Request fields that constrain the output: OpenAI's `response_format` and vLLM's
`structured_outputs` (vLLM 0.32's StructuredOutputsParams: `json`, `regex`, `choice`, `grammar`,
`json_object`), as pydantic models for `gptforge.serve.protocol`. `gptforge.serve.structured` turns
them into grammars.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class JSONSchemaFormat(_Strict):
    """OpenAI's `response_format.json_schema`."""

    name: str = Field(min_length=1, max_length=64)
    """The schema's name (as OpenAI: letters, digits, '_' and '-'; not checked here)."""
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    """The JSON schema the answer must validate against; {} allows any JSON value."""
    strict: bool | None = None
    """Accepted for OpenAI's clients; the output always follows the schema."""


class ResponseFormat(_Strict):
    """`{"type": "text"}` (no constraint), `{"type": "json_object"}` (any JSON object) or
    `{"type": "json_schema", "json_schema": {...}}` (JSON valid under the schema). JSON is compact:
    no whitespace outside strings."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class StructuredOutputs(_Strict):
    """vLLM's `structured_outputs`: exactly one of the constraints."""

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    """A JSON schema (an object, or the same as JSON text): the answer is compact JSON valid under it."""
    regex: str | None = None
    """A regular expression (Rust `regex` syntax) the whole answer matches."""
    choice: list[str] | None = None
    """The answer is exactly one of these strings."""
    grammar: str | None = None
    """A Lark grammar (rule `start`), or a GBNF grammar as llama.cpp takes (rule `root`, `::=`)."""
    json_object: bool | None = None
    """true: the answer is any JSON object."""


# ---- tools (OpenAI API reference: Chat, `tools`, `tool_choice`, `tool_calls`) --------------------

class FunctionDefinition(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """A JSON schema of type object for the arguments (None: no arguments)."""
    strict: bool | None = None
    """Accepted for OpenAI's clients; a forced call's arguments always follow the schema."""


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    """Call this function (its arguments constrained to its schema)."""

    type: Literal["function"]
    function: NamedFunction


class FunctionCall(BaseModel):
    name: str
    arguments: str
    """The arguments as a JSON text."""


class ToolCall(BaseModel):
    """A call in a request's assistant message or in an answer."""

    model_config = ConfigDict(extra="forbid")
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionCallDelta(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(BaseModel):
    """A streamed call: gptforge sends each call whole, in one delta."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta
