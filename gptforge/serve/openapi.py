"""The server's OpenAPI 3.1 document, built from the pydantic models in `gptforge.serve.protocol`.

Routes parse their own bodies (so that malformed JSON, an oversized body and every invalid field
get OpenAI's error object), so each route declares its request body and responses with
`route_doc`, and `openapi` adds the models' JSON schemas under components/schemas with this
server's limits written in (`_tighten`: the served model id, the vocabulary, the context); with an
API key, a bearer security scheme covers every route but /health, /metrics and /openapi.json.

Streams: `text/event-stream` responses are server-sent events; as OpenAPI before 3.2 has it (no
`itemSchema`), the media type's schema describes one event: its `data` is "[DONE]" or JSON
whose schema is given as `contentSchema` (JSON Schema 2020-12 content vocabulary).
"""

from __future__ import annotations

from pydantic.json_schema import models_json_schema

from gptforge.serve.protocol import REQUEST_MODELS, RESPONSE_MODELS, ErrorResponse

OPEN_PATHS = ("/", "/health", "/metrics", "/openapi.json")
"""Paths that need no API key ("/": the chat page, which asks for the key itself)."""

_ERRORS = {
    400: "Invalid parameters: `param` names the field, `code` says what is wrong",
    401: "Missing or wrong API key",
    404: "Another model than the one served (`model_not_found`)",
    413: "The body is over the server's limit (`request_too_large`)",
    429: "Too many sequences wait for a cache slot (`queue_full`); retry after Retry-After seconds",
    500: "Generation failed inside the engine",
    503: "The engine is not running (an engine process that has exited)",
}


def ref(model) -> dict:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _json(model) -> dict:
    return {"application/json": {"schema": ref(model)}}


def _event_stream(chunk) -> dict:
    data = {"anyOf": [{"const": "[DONE]"},
                      {"type": "string", "contentMediaType": "application/json",
                       "contentSchema": {"anyOf": [ref(chunk), ref(ErrorResponse)]}}]}
    return {"text/event-stream": {"schema": {
        "type": "object", "required": ["data"], "properties": {"data": data, "event": {"const": "message"}},
        "description": f"One server-sent event: `data: <{chunk.__name__} JSON>`, one per chunk; an "
                       "ErrorResponse if generation fails mid-stream; `data: [DONE]` last."}}}


def route_doc(request=None, response=None, stream=None, errors: tuple[int, ...] = (400, 404, 413),
              content: dict | None = None, description: str = "The answer") -> dict:
    """FastAPI route keyword arguments (`openapi_extra`, `responses`) declaring a JSON request body
    of pydantic model `request`, a 200 of model `response` (or raw `content`), with `stream` also a
    `text/event-stream` of that chunk model, and OpenAI error objects for `errors` (429 with its
    Retry-After header)."""
    ok: dict = {"description": description}
    media = dict(content or {})
    if response is not None:
        media.update(_json(response))
    if stream is not None:
        media.update(_event_stream(stream))
    if media:
        ok["content"] = media
    responses: dict = {200: ok}
    for status in errors:
        responses[status] = {"description": _ERRORS[status], "content": _json(ErrorResponse)}
        if status == 429:
            responses[status]["headers"] = {"Retry-After": {
                "description": "Whole seconds to wait before retrying", "required": True,
                "schema": {"type": "integer", "minimum": 1}}}
    kw: dict = {"responses": responses}
    if request is not None:
        kw["openapi_extra"] = {"requestBody": {"required": True, "content": _json(request)}}
    return kw


def _tighten(schemas: dict, model_name: str | list[str], vocab_size: int, max_model_len: int) -> None:
    """Write this server's own limits into the request schemas (the routes check each, with a 400):
    the one model id served, token ids inside the vocabulary, token-id prompts that fit in the
    context, no empty prompt, and exactly one of `prompt` or `messages` for /tokenize."""
    model_ids = [model_name] if isinstance(model_name, str) else model_name  # the base, then adapters by name
    served = {"anyOf": [{"type": "string", "enum": model_ids}, {"type": "null"}], "default": None,
              "description": "The served model's id, or a LoRA adapter's (GET /v1/models); another id is a 404."}
    for name in ("CompletionRequest", "ChatRequest", "TokenizeRequest", "DetokenizeRequest"):
        schemas[name]["properties"]["model"] = served
    token = {"type": "integer", "minimum": 0, "maximum": vocab_size - 1}
    ids = {"type": "array", "items": token, "minItems": 1, "maxItems": max_model_len}
    text = {"type": "string", "minLength": 1}
    prompt = schemas["CompletionRequest"]["properties"]["prompt"]
    prompt["anyOf"] = [text, {"type": "array", "items": text, "minItems": 1}, ids,
                       {"type": "array", "items": ids, "minItems": 1}]
    schemas["DetokenizeRequest"]["properties"]["tokens"]["items"] = token
    schemas["TokenizeRequest"]["oneOf"] = [
        {"required": ["prompt"], "properties": {"prompt": {"type": "string"}, "messages": {"type": "null"}}},
        {"required": ["messages"], "properties": {"messages": {"type": "array"}, "prompt": {"type": "null"}}}]


def openapi(app) -> dict:
    """The OpenAPI document of `app` (cached in app.openapi_schema): FastAPI's paths plus the
    protocol models under components/schemas, tightened to this server's limits (`_tighten`), and
    the bearer scheme when the server has an API key."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    from fastapi.openapi.utils import get_openapi

    srv = app.state.server
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    _, defs = models_json_schema([(m, "validation") for m in REQUEST_MODELS + RESPONSE_MODELS],
                                 ref_template="#/components/schemas/{model}")
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(defs["$defs"])
    _tighten(schemas, [srv.cfg.model_name, *srv.adapters.by_name], srv.tok.vocab_size, srv.max_model_len)
    if srv.cfg.api_key is not None:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        for path, ops in doc["paths"].items():
            if path in OPEN_PATHS:
                continue
            for op in ops.values():
                op["security"] = [{"bearer": []}]
                op["responses"]["401"] = {"description": _ERRORS[401], "content": _json(ErrorResponse)}
    app.openapi_schema = doc
    return doc
