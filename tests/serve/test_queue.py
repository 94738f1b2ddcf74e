"""The queue bound (429 + Retry-After, filled deterministically with the engine paused) and prompts
far beyond the context refused before they are tokenized."""

from __future__ import annotations

import json
import re
import threading
import time

import httpx
import pytest

from tests.serve.conftest import LiveServer

BATCH, QUEUE = 2, 2


@pytest.fixture(scope="module")
def bounded(trained, tokenizer_file):
    """A server with 2 cache slots, at most 2 more sequences waiting, the default 4 MiB body limit."""
    from gptforge.serve.app import ServeConfig, create_app

    model, _tok = trained
    cfg = ServeConfig(model_name="tiny", max_batch_size=BATCH, max_queue=QUEUE)
    with LiveServer(create_app(model, tokenizer_file, cfg)) as srv:
        yield srv


def _post(live, body, path="/v1/completions"):
    return httpx.post(live.url + path, json=dict(body, model="tiny"), timeout=60)


def _wait_for(predicate, what: str):
    deadline = time.time() + 30
    while not predicate():
        assert time.time() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


def test_a_full_queue_answers_429_with_retry_after_then_serves_again(bounded):
    engine = bounded.app.state.server.engine
    body = {"prompt": "def f():", "max_tokens": 2, "temperature": 0}
    statuses: dict[int, int] = {}
    threads = []
    engine.pause()
    try:
        # Paused, the engine admits nothing: the first BATCH requests wait for the free slots, the
        # next QUEUE are the queue; every one is waiting in the engine before the next is sent.
        for k in range(BATCH + QUEUE):
            t = threading.Thread(target=lambda k=k: statuses.__setitem__(k, _post(bounded, body).status_code))
            t.start()
            threads.append(t)
            _wait_for(lambda k=k: engine.num_waiting == k + 1, f"request {k} is queued")
        for stream in (False, True):
            r = _post(bounded, dict(body, stream=stream))
            assert r.status_code == 429, r.text
            assert r.headers["retry-after"].isdigit() and 1 <= int(r.headers["retry-after"]) <= 60
            err = r.json()["error"]
            assert err["code"] == "queue_full" and f"at most {QUEUE} may wait" in err["message"]
            # BATCH of the queued requests take the free slots at the next step: only QUEUE wait
            # (issue 41 item 8: the message counted them all).
            assert f"busy: {QUEUE} sequence(s) already wait" in err["message"], err["message"]
            assert f"this request's 1 would make {QUEUE + 1} wait" in err["message"], err["message"]
        r = _post(bounded, dict(body, n=BATCH + QUEUE + 1))  # more than the server ever takes at once: 400
        assert r.status_code == 400 and r.json()["error"]["param"] == "n"
        assert engine.num_waiting == BATCH + QUEUE  # the refused requests queued nothing
    finally:
        engine.resume()
    for t in threads:
        t.join(60)
    assert statuses == {k: 200 for k in range(BATCH + QUEUE)}
    assert _post(bounded, dict(body, n=BATCH + QUEUE)).status_code == 200  # drained: the whole bound is free
    metrics = httpx.get(bounded.url + "/metrics", timeout=30).text
    assert 'gptforge_requests_total{endpoint="/v1/completions",status="429"} 2.0' in metrics


@pytest.fixture
def encoded_lengths(bounded, monkeypatch):
    """The length of every text the server tokenizes during the test."""
    chat = bounded.app.state.server.chat
    real, seen = chat.encode_template, []
    monkeypatch.setattr(chat, "encode_template", lambda text: seen.append(len(text)) or real(text))
    return seen


def test_a_million_token_prompt_is_400_before_it_is_tokenized(bounded, trained, encoded_lengths):
    _model, tok = trained
    srv = bounded.app.state.server
    # "x" never merges with a neighbour (no vocabulary entry holds "xx"): 10^6 x's are 10^6 tokens.
    assert not any("xx" in t for t in srv.chat.tokenizer.get_vocab(with_added_tokens=True))
    assert len(tok.encode("x" * 1000)) == 1000
    text = "x" * 10**6
    for path, body in [("/v1/completions", {"prompt": text, "max_tokens": 1}),
                       ("/v1/completions", {"prompt": ["hi", text], "max_tokens": 1}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}], "max_tokens": 1})]:
        raw = json.dumps(dict(body, model="tiny")).encode()
        r = httpx.post(bounded.url + path, content=raw, headers={"Content-Type": "application/json"}, timeout=60)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        # The count is the prompt's characters (a conversation's adds its few characters of framing).
        chars = int(re.search(r"has (\d+) characters", err["message"]).group(1))
        assert err["code"] == "context_length_exceeded" and 10**6 <= chars <= 10**6 + 16, err["message"]
    assert max(encoded_lengths, default=0) <= srv.max_prompt_chars  # only "hi" was tokenized, never the text
    r = _post(bounded, {"prompt": [5] * 10**6, "max_tokens": 1})  # a million token ids: refused before the scan
    assert r.status_code == 400 and "1000000 tokens" in r.json()["error"]["message"]
    assert _post(bounded, {"prompt": "x" * 10, "max_tokens": 1}).status_code == 200  # short prompts still serve
