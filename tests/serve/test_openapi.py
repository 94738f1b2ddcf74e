"""GET /openapi.json: every route with its request and response models; streams declared as
server-sent events whose chunks match their pydantic models."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.serve.conftest import API_KEY

H = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def doc(live):
    r = httpx.get(live.url + "/openapi.json", timeout=30)  # needs no API key
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    return r.json()


def test_every_route_is_declared_with_its_models(doc):
    assert doc["openapi"].startswith("3.1")
    paths = doc["paths"]
    assert sorted(f"{m.upper()} {p}" for p, ops in paths.items() for m in ops) == sorted(
        ["GET /health", "GET /metrics", "GET /v1/models", "GET /tokenizer_info", "POST /tokenize",
         "POST /detokenize", "POST /v1/completions", "POST /v1/chat/completions", "POST /v1/load_lora_adapter",
         "POST /v1/unload_lora_adapter"])
    schemas = doc["components"]["schemas"]
    for path, request, response in [("/v1/completions", "CompletionRequest", "Completion"),
                                    ("/v1/chat/completions", "ChatRequest", "ChatCompletion"),
                                    ("/tokenize", "TokenizeRequest", "TokenizeResponse"),
                                    ("/detokenize", "DetokenizeRequest", "DetokenizeResponse")]:
        op = paths[path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/" + request)
        assert op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/" + response)
        assert op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
        assert op["security"] == [{"bearer": []}] and "401" in op["responses"]
        assert request in schemas and response in schemas
        assert schemas[request]["properties"]["model"]["anyOf"][0]["enum"] == ["tiny"]
    assert schemas["CompletionRequest"]["additionalProperties"] is False
    assert schemas["CompletionRequest"]["properties"]["temperature"]["maximum"] == 2
    assert "security" not in paths["/health"]["get"] and "security" not in paths["/metrics"]["get"]
    assert doc["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}


def test_streams_are_declared_as_server_sent_events(doc):
    for path, chunk in [("/v1/completions", "CompletionChunk"), ("/v1/chat/completions", "ChatCompletionChunk")]:
        responses = doc["paths"][path]["post"]["responses"]
        event = responses["200"]["content"]["text/event-stream"]["schema"]
        data = event["properties"]["data"]["anyOf"]
        assert data[0] == {"const": "[DONE]"} and data[1]["contentMediaType"] == "application/json"
        assert data[1]["contentSchema"]["anyOf"][0]["$ref"].endswith("/" + chunk)
        assert responses["429"]["headers"]["Retry-After"]["required"] is True
        assert chunk in doc["components"]["schemas"]


def _chunks(live, path, body):
    with httpx.stream("POST", live.url + path, json=body, headers=H, timeout=60) as r:
        assert r.status_code == 200
        events = [e for e in r.read().decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    return [json.loads(e[len("data: "):]) for e in events[:-1]]


def test_streamed_chunks_and_whole_answers_match_their_models(live):
    from gptforge.serve.protocol import ChatCompletion, ChatCompletionChunk, Completion, CompletionChunk

    usage = {"stream_options": {"include_usage": True}}
    body = {"model": "tiny", "prompt": "def f():", "max_tokens": 4, "echo": True, "logprobs": 2, "n": 2}
    chunks = _chunks(live, "/v1/completions", dict(body, stream=True, **usage))
    parsed = [CompletionChunk.model_validate(c) for c in chunks]
    assert parsed[-1].usage is not None and all(c.usage is None for c in parsed[:-1])
    assert chunks[0]["choices"][0]["logprobs"]["tokens"]  # the echoed prompt's tokens
    Completion.model_validate(httpx.post(live.url + "/v1/completions", json=body, headers=H, timeout=60).json())
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "logprobs": True,
            "top_logprobs": 2}
    chunks = _chunks(live, "/v1/chat/completions", dict(body, stream=True, **usage))
    parsed = [ChatCompletionChunk.model_validate(c) for c in chunks]
    assert parsed[0].choices[0].delta.role == "assistant" and parsed[-1].usage.completion_tokens == 4
    assert any(c.choices and c.choices[0].logprobs for c in parsed)
    ChatCompletion.model_validate(httpx.post(live.url + "/v1/chat/completions", json=body, headers=H,
                                             timeout=60).json())
