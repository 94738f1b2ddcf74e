"""Schemathesis against a live server's own /openapi.json: no 5xx, every response as declared.

Each operation gets `MAX_EXAMPLES` generated requests, valid and invalid (hypothesis, derandomized,
no example database), sent over HTTP to a uvicorn server in this process. Checks: no server error,
the status, content type, headers and body as the schema declares them, schema-invalid bodies
refused with a 4xx, and the API key enforced. Generated `max_tokens` are capped so that a run
takes seconds; every streamed chunk is validated against its pydantic model as well. Cases come
from hypothesis `@given` over `operation.as_strategy` (schemathesis' own pytest plugin, its
`schema.parametrize`, fails under pytest 9: it reads the removed `Function._nodeid`).
"""

from __future__ import annotations

import json

import pytest

from tests.serve.conftest import API_KEY, LiveServer

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is in the test extra")

MAX_EXAMPLES = 50
MAX_TOKENS = 3

OPERATIONS = ["GET /health", "GET /metrics", "GET /v1/models", "GET /tokenizer_info", "POST /tokenize",
              "POST /detokenize", "POST /v1/completions", "POST /v1/chat/completions", "POST /v1/load_lora_adapter",
              "POST /v1/unload_lora_adapter"]


@pytest.fixture(scope="module")
def fuzz_live(trained, tokenizer_file):
    from gptforge.serve.app import ServeConfig, create_app

    model, _tok = trained
    cfg = ServeConfig(model_name="tiny", api_key=API_KEY, max_batch_size=4, max_queue=8, max_body_bytes=64 * 1024)
    with LiveServer(create_app(model, tokenizer_file, cfg)) as srv:
        yield srv


@pytest.fixture(scope="module")
def api_schema(fuzz_live):
    return schemathesis.openapi.from_url(fuzz_live.url + "/openapi.json")


def test_the_schema_lists_every_route(api_schema):
    ops = [r.ok() for r in api_schema.get_all_operations()]
    assert sorted(f"{op.method.upper()} {op.path}" for op in ops) == sorted(OPERATIONS)


def _cap(case) -> None:
    """Keep generation short: max_tokens (or chat's max_completion_tokens) at most MAX_TOKENS."""
    body = case.body
    if not isinstance(body, dict):
        return
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    if case.path in ("/v1/completions", "/v1/chat/completions"):
        value = body.get(key)
        if value is None or (type(value) is int and value > MAX_TOKENS):
            body[key] = MAX_TOKENS


def _check_stream(path: str, response) -> None:
    from gptforge.serve.protocol import ChatCompletionChunk, CompletionChunk, ErrorResponse

    chunk_model = ChatCompletionChunk if path == "/v1/chat/completions" else CompletionChunk
    events = [e for e in response.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]", events[-1:]
    for e in events[:-1]:
        assert e.startswith("data: "), e
        data = json.loads(e[len("data: "):])
        (ErrorResponse if "error" in data else chunk_model).model_validate(data)


@pytest.mark.parametrize("operation", OPERATIONS)
def test_the_server_conforms_to_its_own_schema(api_schema, fuzz_live, operation):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        ignored_auth,
        negative_data_rejection,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    method, path = operation.split()
    op = api_schema[path][method]
    modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if method == "POST" else [])
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
              response_schema_conformance, negative_data_rejection, ignored_auth]

    @settings(max_examples=MAX_EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(case=st.one_of(*(op.as_strategy(m) for m in modes)))
    def fuzz(case):
        _cap(case)
        response = case.call_and_validate(base_url=fuzz_live.url, headers={"Authorization": f"Bearer {API_KEY}"},
                                          timeout=60, checks=checks)
        if " ".join(response.headers.get("content-type", [])).startswith("text/event-stream"):
            _check_stream(path, response)

    fuzz()
