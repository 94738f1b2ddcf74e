"""Raw HTTP: exact SSE bytes, error statuses, tokenizer routes, metrics, disconnects."""

import json
import time

import httpx
import pytest

from tests.serve.conftest import API_KEY

H = {"Authorization": f"Bearer {API_KEY}"}


def _post(live, path, body, **kw):
    return httpx.post(live.url + path, json=body, headers=H, timeout=60, **kw)


def test_sse_bytes_are_openai_framing(live):
    body = {"model": "tiny", "prompt": "import os", "max_tokens": 5, "temperature": 0, "stream": True}
    with httpx.stream("POST", live.url + "/v1/completions", json=body, headers=H, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(r.iter_bytes())
    events = raw.split(b"\n\n")
    assert events[-1] == b"" and events[-2] == b"data: [DONE]"
    chunks = [json.loads(e[len(b"data: "):]) for e in events[:-2]]
    assert all(e.startswith(b"data: {") for e in events[:-2])
    assert all("usage" not in c for c in chunks)  # no usage without include_usage
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    plain = _post(live, "/v1/completions", dict(body, stream=False)).json()
    assert "".join(c["choices"][0]["text"] for c in chunks) == plain["choices"][0]["text"]


def test_chat_sse_first_delta_has_the_role_and_usage_chunk_has_no_choices(live):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", live.url + "/v1/chat/completions", json=body, headers=H, timeout=60) as r:
        raw = b"".join(r.iter_bytes())
    events = [e for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert chunks[-2]["choices"][0]["delta"] == {} and chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert all(c["usage"] is None for c in chunks[:-1])


@pytest.mark.parametrize("body,param", [
    ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "x", "max_tokens": "many"}, "max_tokens"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "frobnicate": 1}, "frobnicate"),
    ({"prompt": [[1, 2, 99999]]}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": "x", "logprobs": 50}, "logprobs"),
    ({"prompt": "x", "best_of": 3}, "best_of"),
])
def test_bad_parameters_are_400_naming_the_field(live, body, param):
    r = _post(live, "/v1/completions", dict(body, model="tiny"))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]


def test_401_404_413_and_bad_json(live):
    r = httpx.post(live.url + "/v1/completions", json={"prompt": "x"}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(live.url + "/health", timeout=30).status_code == 200  # health needs no key
    r = httpx.get(live.url + "/v1/nothing", headers=H, timeout=30)
    assert r.status_code == 404 and "error" in r.json()
    r = _post(live, "/v1/completions", {"model": "tiny", "prompt": "x" * 70_000})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = httpx.post(live.url + "/v1/completions", content=b"{not json", headers=H, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(live.url + "/v1/completions", content=b"[1, 2]", headers=H, timeout=30)
    assert r.status_code == 400



@pytest.mark.parametrize("path,body", [
    ("/v1/completions", b'{"model": "tiny", "prompt": "a\\ud800b", "max_tokens": 2}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\udfff"}], "max_tokens": 2}'),
    ("/tokenize", b'{"prompt": "\\uD83D"}'),
])
def test_a_lone_surrogate_escape_is_400_not_500(live, path, body):
    r = httpx.post(live.url + path, content=body, headers=H, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", r.text
    assert "surrogate" in r.json()["error"]["message"]
    pair = b'{"model": "tiny", "prompt": "\\ud83d\\ude00", "max_tokens": 1}'  # a pair is one character
    assert httpx.post(live.url + "/v1/completions", content=pair, headers=H, timeout=30).status_code == 200


def test_tokenize_detokenize_tokenizer_info(live, trained):
    _model, tok = trained
    r = _post(live, "/tokenize", {"model": "tiny", "prompt": "héllo 世界"}).json()
    assert r["tokens"] == tok.encode("héllo 世界") and r["count"] == len(r["tokens"]) and r["max_model_len"] == 64
    assert _post(live, "/detokenize", {"tokens": r["tokens"]}).json()["prompt"] == "héllo 世界"
    info = httpx.get(live.url + "/tokenizer_info", headers=H, timeout=30).json()
    assert info["eos_token_id"] == tok.eos_id and info["vocab_size"] == tok.vocab_size
    special = _post(live, "/tokenize", {"prompt": tok.eos_token + "a", "add_special_tokens": False}).json()
    assert special["tokens"][0] == tok.eos_id  # as lm-eval's remote tokenizer finds the EOS id
    chat = _post(live, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] > 3


def test_metrics_count_requests_and_tokens(live):
    _post(live, "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 3})
    text = httpx.get(live.url + "/metrics", timeout=30).text
    for name in ("gptforge_requests_total", "gptforge_generation_tokens_total", "gptforge_queue_length",
                 "gptforge_time_to_first_token_seconds_bucket", "gptforge_time_per_output_token_seconds_bucket"):
        assert name in text
    gen = [line for line in text.splitlines() if line.startswith("gptforge_generation_tokens_total")]
    assert float(gen[0].split()[-1]) >= 3


def _generated(live) -> float:
    text = httpx.get(live.url + "/metrics", timeout=30).text
    return float(next(line for line in text.splitlines()
                      if line.startswith("gptforge_generation_tokens_total")).split()[-1])


def test_a_client_that_disconnects_mid_stream_frees_its_slot(live, trained):
    model, _tok = trained
    engine = live.app.state.server.engine
    slow = model.register_forward_pre_hook(lambda *_: time.sleep(0.02))  # ~20 ms per decode step
    try:
        before = _generated(live)
        body = {"model": "tiny", "prompt": "x", "max_tokens": 60, "temperature": 0, "stream": True}
        with httpx.stream("POST", live.url + "/v1/completions", json=body, headers=H, timeout=60) as r:
            for _line in r.iter_lines():
                break  # read one chunk, then hang up
        deadline = time.time() + 10
        while (engine.num_running or engine.num_waiting) and time.time() < deadline:
            time.sleep(0.01)
        assert engine.num_running == 0 and len(engine.free_slots) == engine.max_batch_size
        time.sleep(0.1)
        assert _generated(live) - before < 40  # cancelled long before its 60 tokens
    finally:
        slow.remove()


def test_several_prompts_times_n_choices_are_numbered_prompt_major(live, trained):
    _model, tok = trained
    prompts = [tok.encode("import os"), tok.encode("class A:")]
    r = _post(live, "/v1/completions", {"model": "tiny", "prompt": prompts, "n": 2, "max_tokens": 3, "echo": True,
                                        "temperature": 0}).json()
    assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3]
    heads = ["import os", "import os", "class A:", "class A:"]
    assert all(c["text"].startswith(h) and len(c["text"]) > len(h) for c, h in zip(r["choices"], heads, strict=True))
    cached = r["usage"].pop("prompt_tokens_details")["cached_tokens"]  # earlier tests' prompts may be cached
    assert r["usage"] == {"prompt_tokens": len(prompts[0]) + len(prompts[1]), "completion_tokens": 12,
                          "total_tokens": len(prompts[0]) + len(prompts[1]) + 12}
    assert 0 <= cached < r["usage"]["prompt_tokens"]
