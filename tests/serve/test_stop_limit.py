"""More than 4 `stop` sequences are refused, as OpenAI refuses them (issue 41 item 8)."""

from __future__ import annotations

import httpx

from tests.serve.conftest import API_KEY

H = {"Authorization": f"Bearer {API_KEY}"}


def test_more_than_four_stop_sequences_are_refused(live):
    for path, body in (("/v1/completions", {"prompt": "x"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})):
        r = httpx.post(live.url + path, json=dict(body, model="tiny", max_tokens=2, stop=["a", "b", "c", "d", "e"]),
                       headers=H, timeout=60)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "stop" and "at most 4" in err["message"]
        ok = httpx.post(live.url + path, json=dict(body, model="tiny", max_tokens=2, stop=["a", "b", "c", "d"]),
                        headers=H, timeout=60)
        assert ok.status_code == 200, ok.text
