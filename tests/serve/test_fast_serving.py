"""Prefix reuse and n-gram speculation behind the HTTP API: usage.prompt_tokens_details.cached_tokens,
their /metrics, and answers equal to a plain server's."""

from __future__ import annotations

import httpx
import pytest

from tests.serve.conftest import LiveServer

CODE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"


@pytest.fixture(scope="module")
def pair(trained, tokenizer_file):
    """(fast, plain): servers over the trained model, one with prefix reuse (one spare slot) and
    n-gram speculation, one with neither."""
    from gptforge.serve.app import ServeConfig, create_app

    model, _tok = trained
    fast = create_app(model, tokenizer_file, ServeConfig(model_name="tiny", max_batch_size=2, prefix_cache_slots=1,
                                                         speculative="ngram", num_speculative_tokens=4))
    plain = create_app(model, tokenizer_file, ServeConfig(model_name="tiny", max_batch_size=2, prefix_caching=False))
    with LiveServer(fast) as f, LiveServer(plain) as p:
        yield f, p


def _complete(srv, prompt, **kw):
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0, **kw}
    r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _metric(srv, name: str) -> float:
    text = httpx.get(srv.url + "/metrics", timeout=10).text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


def test_cached_tokens_in_usage_and_metrics_and_the_same_answers(pair, trained):
    fast, plain = pair
    _model, tok = trained
    ids = tok.encode(CODE)[:36]
    shared = ids[:28]
    first = _complete(fast, ids)
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    second = _complete(fast, shared + tok.encode("import os"))
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 28
    again = _complete(fast, ids, n=2)  # the prompt counts once, as prompt_tokens does
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == len(ids) - 1
    for body, got in ((ids, first), (shared + tok.encode("import os"), second)):
        want = _complete(plain, body)
        assert want["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        assert got["choices"][0]["text"] == want["choices"][0]["text"]
    assert {c["text"] for c in again["choices"]} == {first["choices"][0]["text"]}
    hits, query = _metric(fast, "gptforge_prefix_cache_hit_tokens"), _metric(fast, "gptforge_prefix_cache_query_tokens")
    # Both choices of `again` reused the first prompt (kept in the spare slot when `second` took its slot).
    assert (hits, query) == (28 + 2 * (len(ids) - 1), 3 * len(ids) + len(shared + tok.encode("import os")))
    assert _metric(fast, "gptforge_prefix_cache_hit_rate") == pytest.approx(hits / query)
    assert _metric(plain, "gptforge_prefix_cache_hit_tokens") == 0


def test_speculation_answers_as_plain_decoding_and_reports_acceptance(pair, trained):
    fast, plain = pair
    _model, tok = trained
    prompt = tok.encode(CODE * 2)[-40:]
    got = _complete(fast, prompt, max_tokens=20, stream=False)
    want = _complete(plain, prompt, max_tokens=20)
    assert got["choices"][0]["text"] == want["choices"][0]["text"]
    assert got["usage"]["completion_tokens"] == 20
    r = httpx.post(fast.url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny", "messages": [{"role": "user", "content": "return a + b\nreturn a + b\n"}], "max_tokens": 10, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
    draft, accepted = _metric(fast, "gptforge_spec_decode_draft_tokens"), _metric(fast, "gptforge_spec_decode_accepted_tokens")
    assert draft > 0 and 0 < accepted <= draft
    assert _metric(fast, "gptforge_spec_decode_acceptance_rate") == pytest.approx(accepted / draft)
    assert _metric(plain, "gptforge_spec_decode_draft_tokens") == 0


def test_response_format_is_followed_with_prefix_reuse_and_speculation(pair, trained):
    pytest.importorskip("llguidance", reason="llguidance is in the serve and test extras")
    import json

    fast, plain = pair
    _model, tok = trained
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                               "code": {"type": "string", "maxLength": 30}},
              "required": ["name", "code"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "f", "schema": schema}}
    prompt = tok.encode(CODE * 2)[-30:]
    want = _complete(plain, prompt, max_tokens=34, response_format=fmt)
    for _ in range(2):  # the second time from the cached prompt
        got = _complete(fast, prompt, max_tokens=34, response_format=fmt)
        assert got["choices"][0]["text"] == want["choices"][0]["text"]
    assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == len(prompt) - 1
    if want["choices"][0]["finish_reason"] == "stop":
        assert set(json.loads(want["choices"][0]["text"])) == {"name", "code"}
    else:
        assert want["choices"][0]["text"].startswith('{"name":"')


def test_serve_compile_option_decodes_through_static_steps(pair, trained, tokenizer_file):
    from gptforge.infer.engine_compile import CompiledDecode
    from gptforge.serve.app import ServeConfig, create_app

    model, tok = trained
    _fast, plain = pair
    app = create_app(model, tokenizer_file, ServeConfig(model_name="tiny", max_batch_size=2, compile_decode=True))
    engine = app.state.server.engine
    assert isinstance(engine.compiled, CompiledDecode) and engine.compiled.compile
    # The static-shape steps run eagerly here (tests/infer/test_engine_compile.py compiles one).
    engine.compiled = CompiledDecode(model, engine.caches, engine.max_model_len, compile=False)
    prompt = tok.encode(CODE)[:20]
    with LiveServer(app) as srv:
        got = _complete(srv, prompt, max_tokens=16)
    assert got["choices"][0]["text"] == _complete(plain, prompt, max_tokens=16)["choices"][0]["text"]
    assert engine.compiled.steps  # the decode passes went through them
