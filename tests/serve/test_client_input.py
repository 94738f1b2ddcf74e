"""Client input never gives a 500: odd but valid values are served, invalid ones get a 4xx."""

import httpx
import pytest

from tests.serve.conftest import API_KEY

H = {"Authorization": f"Bearer {API_KEY}"}

COMPLETIONS = [
    ({"prompt": "x", "seed": -1, "max_tokens": 2, "temperature": 1}, 200),
    ({"prompt": "x", "seed": 2**70, "max_tokens": 2, "temperature": 1}, 200),
    ({"prompt": "x", "stop": [""], "max_tokens": 2}, 200),
    ({"prompt": "x", "top_k": 100000, "max_tokens": 2, "temperature": 1}, 200),
    ({"prompt": "x", "n": 2, "best_of": 2, "max_tokens": 2}, 200),
    ({"prompt": "<|endoftext|>", "max_tokens": 2}, 200),
    ({"prompt": "x", "top_p": 1e-300, "max_tokens": 2, "temperature": 1}, 200),  # 0 in float32
    ({"prompt": "x", "temperature": 5e-324, "max_tokens": 2}, 200),  # logits / T overflow
    ({"prompt": "x", "max_tokens": 2, "presence_penalty": 2, "frequency_penalty": -2, "temperature": 0.5}, 200),
    ({"prompt": "x", "stop": [1, 2], "max_tokens": 2}, 400),
    ({"prompt": [1, "a"], "max_tokens": 2}, 400),
    ({"prompt": [], "max_tokens": 2}, 400),
    ({"prompt": None}, 400),
    ({"prompt": "x", "max_tokens": 10**15}, 400),
    ({"prompt": "x", "stream_options": {"bogus": True}}, 400),
    ({"prompt": "x" * 500, "max_tokens": 2}, 400),
]
CHAT = [
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 2}, 200),
    ({"messages": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "x"}],
      "max_completion_tokens": 2, "n": 3, "seed": 5, "temperature": 1}, 200),
    ({"messages": []}, 400),
    ({"messages": "hello"}, 400),
    ({"messages": [{"role": "tool", "content": "x"}]}, 400),
    ({"messages": [{"role": "user"}]}, 400),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400),
    ({"messages": [{"role": "user", "content": "x" * 400}]}, 400),
]


@pytest.mark.parametrize("path,body,status", [("/v1/completions", b, s) for b, s in COMPLETIONS]
                         + [("/v1/chat/completions", b, s) for b, s in CHAT])
def test_client_input_is_served_or_refused_never_a_500(live, path, body, status):
    r = httpx.post(live.url + path, json=dict(body, model="tiny"), headers=H, timeout=30)
    assert r.status_code == status, r.text
    if status == 400:
        err = r.json()["error"]
        assert err["message"] and "str" not in (err["param"] or "").split(".")  # the field, not pydantic's union tag


def test_nan_temperature_is_refused(live):
    r = httpx.post(live.url + "/v1/completions", content=b'{"prompt": "x", "temperature": NaN}', headers=H, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
