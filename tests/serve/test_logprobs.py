"""Log-probabilities of streamed and whole answers: the same entries, offsets over the whole text,
nothing reported for the tokens of a stop string that cut the answer (gptforge.serve.logprobs)."""

from __future__ import annotations

import json

import httpx

from tests.serve.conftest import API_KEY

H = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "def "
SAMPLED = {"temperature": 1.0, "seed": 1234}  # varied text (greedy repeats spaces), the same every time


def _whole(live, path, body):
    r = httpx.post(live.url + path, json=body, headers=H, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _streamed(live, path, body):
    with httpx.stream("POST", live.url + path, json={**body, "stream": True}, headers=H, timeout=60) as r:
        assert r.status_code == 200
        raw = b"".join(r.iter_bytes())
    return [json.loads(e[len(b"data: "):]) for e in raw.split(b"\n\n") if e.startswith(b"data: {")]


def _stop_string(live) -> tuple[str, str]:
    """(free greedy continuation, a stop string that cuts it after its first token)."""
    free = _whole(live, "/v1/completions", {"model": "tiny", "prompt": PROMPT, "max_tokens": 24, **SAMPLED})["text"]
    for k in range(1, len(free) - 2):
        stop = free[k:k + 2]
        if free.find(stop) == k and stop.strip():
            return free, stop
    raise AssertionError(f"no stop string found in {free!r}")


def test_streamed_offsets_count_over_the_whole_text_as_the_whole_answer_does(live):
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 1, "echo": True}
    whole = _whole(live, "/v1/completions", body)["logprobs"]
    chunks = _streamed(live, "/v1/completions", body)
    offsets = [o for c in chunks for ch in c["choices"] if ch["logprobs"] for o in ch["logprobs"]["text_offset"]]
    tokens = [t for c in chunks for ch in c["choices"] if ch["logprobs"] for t in ch["logprobs"]["tokens"]]
    assert offsets == whole["text_offset"] and tokens == whole["tokens"]
    assert offsets == sorted(offsets) and offsets[0] == 0
    assert whole["text_offset"][len(whole["tokens"]) - 8] == len(PROMPT)  # the first generated token


def test_tokens_of_a_stop_string_are_not_reported(live):
    free, stop = _stop_string(live)
    cut = free[:free.index(stop)]
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 24, **SAMPLED, "logprobs": 0, "stop": [stop]}
    whole = _whole(live, "/v1/completions", body)
    assert whole["text"] == cut and whole["finish_reason"] == "stop"
    lp = whole["logprobs"]
    assert lp["tokens"] and all(len(PROMPT) <= o < len(PROMPT) + len(cut) for o in lp["text_offset"])
    # Plain ASCII tokens here: their texts cover the answer; the last may run into the stop string.
    joined = "".join(lp["tokens"])
    assert joined.startswith(cut) and len(joined) - len(lp["tokens"][-1]) < len(cut) <= len(joined)
    streamed = _streamed(live, "/v1/completions", body)
    tokens = [t for c in streamed for ch in c["choices"] if ch["logprobs"] for t in ch["logprobs"]["tokens"]]
    assert tokens == lp["tokens"]


def test_chat_reports_no_logprobs_for_a_cut_stop_string(live):
    body = {"model": "tiny", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 24, **SAMPLED,
            "logprobs": True}
    free = _whole(live, "/v1/chat/completions", body)["message"]["content"]
    k = next(k for k in range(1, len(free) - 2) if free[k:k + 2].strip() and free.find(free[k:k + 2]) == k)
    stop = free[k:k + 2]
    choice = _whole(live, "/v1/chat/completions", {**body, "stop": [stop]})
    assert choice["message"]["content"] == free[:k]
    content = choice["logprobs"]["content"]
    joined = "".join(e["token"] for e in content)
    assert joined.startswith(free[:k]) and len(joined) - len(content[-1]["token"]) < k <= len(joined)
    assert all(bytes(e["bytes"]).decode() == e["token"] for e in content)


def test_tokenize_runs_off_the_event_loop(live, monkeypatch):
    import threading

    srv = live.app.state.server
    started, release = threading.Event(), threading.Event()
    encode = srv.encode

    def held(text):
        started.set()
        release.wait(30)
        return encode(text)

    monkeypatch.setattr(srv, "encode", held)
    answers = []
    t = threading.Thread(target=lambda: answers.append(httpx.post(
        live.url + "/tokenize", json={"model": "tiny", "prompt": "some text"}, headers=H, timeout=60)))
    t.start()
    try:
        assert started.wait(30)
        health = httpx.get(live.url + "/health", timeout=10)  # answered while the tokenizer is held
    finally:
        release.set()
        t.join(60)
    assert health.status_code == 200 and answers[0].status_code == 200 and answers[0].json()["count"] > 0


def test_values_of_the_wrong_json_type_are_refused_as_the_schema_says(live):
    for field, value in (("max_tokens", "5"), ("max_tokens", True), ("n", "2"), ("echo", "yes"), ("echo", 1),
                         ("stream", "false"), ("temperature", "0.5")):
        r = httpx.post(live.url + "/v1/completions", json={"model": "tiny", "prompt": "x", field: value},
                       headers=H, timeout=60)
        assert r.status_code == 400 and field in r.json()["error"]["message"], (field, value, r.text)
    ok = httpx.post(live.url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2,
                                                         "temperature": 1}, headers=H, timeout=60)
    assert ok.status_code == 200  # an integer is a number
    r = httpx.post(live.url + "/v1/chat/completions", json={"model": "tiny", "top_logprobs": 3,
                   "messages": [{"role": "user", "content": "hi"}]}, headers=H, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"
