"""The real `openai` client against a live server on loopback."""

import pytest

from gptforge.infer.stream import REPLACEMENT

PROMPT = "def main():\n    "


def test_models_list(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_completion_echo_logprobs_max_tokens_1_as_lm_eval_sends(client, trained):
    import torch

    model, tok = trained
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=1, echo=True, logprobs=1, temperature=0)
    (c,) = r.choices
    ids = tok.encode(PROMPT)
    lp = c.logprobs
    assert len(lp.tokens) == len(ids) + 1 and lp.token_logprobs[0] is None
    assert c.text.startswith(PROMPT) and c.finish_reason == "length"
    with torch.no_grad():
        ref = model(torch.tensor([ids]))[0].float().log_softmax(-1)
    for t in range(1, len(ids)):
        assert lp.token_logprobs[t] == pytest.approx(float(ref[t - 1, ids[t]]), abs=1e-4)
    greedy = int(ref[-1].argmax())
    assert lp.tokens[-1] == tok.decode([greedy])
    assert max(lp.top_logprobs[-1].values()) == pytest.approx(lp.token_logprobs[-1], abs=1e-5)
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 1


def test_max_tokens_zero_with_echo_scores_the_prompt(client):
    r = client.completions.create(model="tiny", prompt=[[5, 9, 17, 33]], max_tokens=0, echo=True, logprobs=0)
    c = r.choices[0]
    assert len(c.logprobs.token_logprobs) == 4 and c.logprobs.token_logprobs[0] is None
    assert all(x < 0 for x in c.logprobs.token_logprobs[1:]) and r.usage.completion_tokens == 0


def test_chat_streaming_with_usage(client):
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi 你好 👍🏽"}],
                                            max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    assert all(ch.usage is None for ch in chunks[:-1])
    finish = [ch.choices[0].finish_reason for ch in chunks[:-1] if ch.choices[0].finish_reason]
    assert finish in (["length"], ["stop"])
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks[:-1])
    full = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi 你好 👍🏽"}],
                                          max_tokens=12, temperature=0)
    assert text == full.choices[0].message.content and REPLACEMENT not in text
    assert full.usage.completion_tokens == chunks[-1].usage.completion_tokens


def test_n_2_stop_strings_and_seed(client):
    free = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=20, temperature=0)
    text = free.choices[0].text
    stop = text[3:6]
    cut = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=20, temperature=0, stop=[stop, "zzz"])
    assert cut.choices[0].text == text[: text.find(stop)] and cut.choices[0].finish_reason == "stop"
    a = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=1.0, seed=11, n=2)
    b = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=1.0, seed=11, n=2)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert a.choices[0].text != a.choices[1].text  # each choice has its own sample
    assert a.usage.completion_tokens == 32


def test_without_max_tokens_the_context_is_the_limit(client, tokenizer_file):
    r = client.completions.create(model="tiny", prompt=PROMPT, temperature=0, extra_body={"top_k": 1})
    assert r.usage.prompt_tokens + r.usage.completion_tokens <= 64
    if r.choices[0].finish_reason == "length":
        assert r.usage.prompt_tokens + r.usage.completion_tokens == 64


def test_openai_errors(client, live):
    import openai

    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4", prompt="x", max_tokens=1)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x", max_tokens=0)
    assert e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x" * 10, max_tokens=60)
    assert "max_tokens is 60" in e.value.body["message"] and "64" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], temperature=-1)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x", n=0)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                       response_format={"type": "json_schema"})
    assert e.value.body["param"] == "response_format.json_schema"
    client.completions.create(model="tiny", prompt="x", max_tokens=1, user="someone")  # accepted, ignored
    bad = openai.OpenAI(base_url=live.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_chat_logprobs_and_top_logprobs(client):
    r = client.chat.completions.create(model="tiny", messages=[{"role": "system", "content": "be brief"},
                                                               {"role": "user", "content": "hello"}],
                                       max_tokens=5, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-5)  # greedy = the best
        assert bytes(entry.bytes).decode("utf-8", errors="replace") == entry.token


def test_echo_logprobs_of_a_split_character_spell_bytes_and_keep_offsets_in_the_text(client, trained):
    _model, tok = trained
    prompt = "x = '字'\n"
    ids = tok.encode(prompt)
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=0, echo=True, logprobs=1)
    c = r.choices[0]
    tokens, offsets = c.logprobs.tokens, c.logprobs.text_offset
    assert c.text == prompt and len(tokens) == len(ids)
    assert not any(REPLACEMENT in t for t in tokens)
    split = [t for t in tokens if t.startswith("bytes:")]
    assert split and all(len(t) > len("bytes:") for t in split)
    assert offsets == sorted(offsets) and offsets[0] == 0 and offsets[-1] < len(prompt)
    # every token's offset points at the character it starts or continues
    assert [prompt[o] for o in offsets][-1] == "\n"
    assert prompt[offsets[tokens.index(split[0])]] == "字"
