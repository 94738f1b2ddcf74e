"""Request and response bodies of the OpenAI-compatible API (OpenAI API reference: Completions,
Chat) as pydantic models, and the OpenAI error object; the server's OpenAPI schema is built from them.

Unknown fields are refused (400, naming them); OpenAI fields gptforge does not implement are
accepted by name and refused with a 400 naming the field when set (`UNSUPPORTED`); `user` is
accepted and ignored. `top_k` is an extension (as in vLLM): 0 or -1 means off.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, WithJsonSchema

from gptforge.serve.formats import NamedToolChoice, ResponseFormat, StructuredOutputs, Tool, ToolCall, ToolCallDelta


class APIError(Exception):
    """An error answered as OpenAI's `{"error": {"message", "type", "param", "code"}}` with `status`."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


Unsupported = Annotated[Any, WithJsonSchema({
    "type": "null", "description": "Not supported by this server: only null (another value is a 400 "
                                   "unsupported_parameter)"})]
"""An OpenAI field gptforge does not implement: accepted by name, refused when set (`UNSUPPORTED`)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # the schema's types: "5", or true for a number, is a 400


class StreamOptions(_Strict):
    include_usage: bool = False
    """Send a last chunk with the request's token usage (and empty choices) before [DONE]."""


class _Sampling(_Strict):
    model: str | None = None
    max_tokens: int | None = None
    """Tokens to generate; None: the rest of the context."""
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)
    n: int = Field(1, ge=1, le=64)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    user: str | None = None
    logit_bias: Unsupported = None
    best_of: int | None = None
    service_tier: Unsupported = None
    metadata: Unsupported = None
    store: Unsupported = None
    response_format: ResponseFormat | None = None
    """Constrain the output to JSON (gptforge.serve.formats)."""
    structured_outputs: StructuredOutputs | None = None
    """vLLM's constraints: a JSON schema, regex, choice or grammar (gptforge.serve.formats)."""


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    """Text, texts, token ids or lists of token ids (ids are JSON integers: true/false are refused)."""
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    suffix: Unsupported = None


class ContentPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[ContentPart] | None = None
    """Null only on an assistant message with tool_calls."""
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    """An assistant message's calls (as an answer gave them)."""
    tool_call_id: str | None = None
    """A tool message: the call it answers."""


class ChatRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Tool] | None = Field(None, max_length=64)
    """Functions the model may call (rendered by the chat template; see gptforge.serve.tools)."""
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    """none: no calls; auto (the default with tools): the model decides; required or a named
    function: the answer is one call, its arguments constrained to the function's schema."""
    parallel_tool_calls: bool | None = None
    """Accepted; a forced answer holds one call, an auto one as many as the model writes."""
    functions: Unsupported = None
    function_call: Unsupported = None
    modalities: Unsupported = None
    audio: Unsupported = None
    prediction: Unsupported = None
    reasoning_effort: Unsupported = None


# OpenAI fields that are accepted by name and refused (400 naming them) when set to a value.
UNSUPPORTED = ("logit_bias", "suffix", "functions", "function_call", "modalities", "audio", "prediction",
               "reasoning_effort", "service_tier", "metadata", "store")


class TokenizeRequest(_Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class LoadLoRAAdapterRequest(_Strict):
    """POST /v1/load_lora_adapter."""

    lora_name: str
    """The model id requests will name to use the adapter."""
    lora_path: str
    """The LoRA fine-tune's run directory or checkpoint folder, on the server's disk."""


class UnloadLoRAAdapterRequest(_Strict):
    """POST /v1/unload_lora_adapter."""

    lora_name: str


class DeletedModel(BaseModel):
    """POST /v1/unload_lora_adapter: the adapter no longer served."""

    id: str
    object: Literal["model"] = "model"
    deleted: bool = True


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[StrictInt]


# ---- responses (OpenAI API reference: the Completion, Chat Completion and chunk objects) ---------

FinishReason = Literal["stop", "length", "cancelled", "tool_calls"]
""""length": max_tokens or the end of the context; "stop": a stop string or the end-of-text token;
"cancelled": the server stopped before the sequence finished; "tool_calls": the answer holds tool calls."""


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every 4xx/5xx answer, and the SSE event sent when generation fails mid-stream."""

    error: ErrorBody


class PromptTokensDetails(BaseModel):
    cached_tokens: int
    """Prompt tokens whose keys and values were reused from an earlier prompt (their prefill skipped)."""


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    """Unix seconds when the server started."""
    owned_by: str
    max_model_len: int
    root: str | None = None
    """A LoRA adapter's run directory (None for the base)."""
    parent: str | None = None
    """A LoRA adapter's base: the served model's id (None for the base)."""


class ModelList(BaseModel):
    """GET /v1/models."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class CompletionLogprobs(BaseModel):
    """Per token of a choice's text: its text, log p in nats (None for the first prompt token), the
    top alternatives (text -> log p; None where there is no prediction) and its offset in the text."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    """prompt index * n + choice number."""
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason


class Completion(BaseModel):
    """POST /v1/completions without `stream`."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class CompletionChunkChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None


class CompletionChunk(BaseModel):
    """One `data:` event of POST /v1/completions with `stream`; `usage` only with
    stream_options.include_usage (null on every chunk but the last, whose choices are empty)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]
    """The token's UTF-8 bytes."""


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob]


class ChatCompletionMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    """None when the answer is only tool calls."""
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatCompletionMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason


class ChatCompletion(BaseModel):
    """POST /v1/chat/completions without `stream`."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    """The role on a choice's first chunk, text on the next ones, nothing on its last."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletionChunk(BaseModel):
    """One `data:` event of POST /v1/chat/completions with `stream` (`usage` as in CompletionChunk)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class TokenizeResponse(BaseModel):
    """POST /tokenize."""

    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    """POST /detokenize."""

    prompt: str


class TokenizerInfo(BaseModel):
    """GET /tokenizer_info (the fields lm-eval's remote tokenizer reads)."""

    tokenizer_class: str
    vocab_size: int
    eos_token: str
    eos_token_id: int
    max_model_len: int
    model_max_length: int
    chat_template: str | None
    bos_token: str | None
    add_bos_token: bool


REQUEST_MODELS = (CompletionRequest, ChatRequest, TokenizeRequest, DetokenizeRequest, LoadLoRAAdapterRequest,
                  UnloadLoRAAdapterRequest)
RESPONSE_MODELS = (ErrorResponse, ModelList, Completion, CompletionChunk, ChatCompletion, ChatCompletionChunk,
                   TokenizeResponse, DetokenizeResponse, TokenizerInfo, ModelCard, DeletedModel)
