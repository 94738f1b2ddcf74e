"""LoRA adapters served by name (gptforge.infer.multi_lora, gptforge.serve.adapters): adapter rows
equal the merged fine-tune, base rows equal the base, both in one batch; another base's adapter
is refused naming both; /v1/models, load and unload at runtime."""

from __future__ import annotations

import copy

import httpx
import pytest

from gptforge.infer.engine import Engine, SamplingParams
from tests.infer.near_tie import event_tokens_and_gaps, greedy_flip
from tests.serve.conftest import LiveServer

PROMPTS = ["def main():\n    ", "import os\n", "class A(object):\n"]


@pytest.fixture(scope="module")
def lora_run(trained_run, tiny_shards, tmp_path_factory):
    """A LoRA fine-tune (rank 4, lr 5e-2, 12 steps on the same shards) of the trained test run."""
    from gptforge.config import FinetuneConfig, RunConfig, TrainConfig
    from gptforge.train.workflows.finetune import finetune

    run = tmp_path_factory.mktemp("lora") / "run"
    cfg = RunConfig(train=TrainConfig(max_steps=12, micro_batch_size=4, lr=5e-2, warmup_steps=1, eval_interval=0,
                                      tensorboard=False, device="cpu"))
    finetune(FinetuneConfig(method="lora", lora_rank=4, lora_alpha=8.0), cfg, trained_run, tiny_shards, run,
             progress=False)
    return run


def _greedy(engine, prompts, adapter=None, n=12):
    out: list[list] = [[] for _ in prompts]
    for p, events in zip(prompts, out, strict=True):
        engine.submit(p, SamplingParams(max_tokens=n, temperature=0, logprobs=2, adapter=adapter), events.append)
    while engine.step():
        pass
    return [event_tokens_and_gaps(e) for e in out]


def test_adapter_rows_equal_the_merged_fine_tune_and_base_rows_the_base(trained, lora_run):
    from gptforge.infer.multi_lora import enable_multi_lora, load_adapter
    from gptforge.runtime.loading import load_for_inference

    base, tok = trained
    merged = load_for_inference(lora_run, "cpu")[0]
    model = copy.deepcopy(base)  # the session's model stays a plain GPT
    adapter = load_adapter("sql", lora_run, model, "tiny")
    assert adapter.weights and adapter.base is not None and adapter.scaling == 2.0
    prompts = [tok.encode(t) for t in PROMPTS]
    want_base = _greedy(Engine(base, tok.decode, max_batch_size=6), prompts)
    want_lora = _greedy(Engine(merged, tok.decode, max_batch_size=6), prompts)
    assert [t for t, _ in want_base] != [t for t, _ in want_lora]  # the adapter changes the answers
    eng = Engine(model, tok.decode, max_batch_size=6)
    eng.lora = enable_multi_lora(model)
    got: list[list] = [[] for _ in range(6)]
    for i, p in enumerate(prompts * 2):  # base and adapter rows interleaved in one continuous batch
        eng.submit(p, SamplingParams(max_tokens=12, temperature=0, adapter=adapter if i % 2 else None), got[i].append)
    while eng.step():
        pass
    flips = 0
    for i in range(6):
        want = (want_lora if i % 2 else want_base)[i % 3]
        toks = [e.token_id for e in got[i] if e.token_id is not None]
        flips += greedy_flip(want[0], want[1], toks)[1]
    assert flips <= 1


def test_an_adapter_of_another_base_is_refused_naming_both(trained, trained_run, lora_run):
    from gptforge.config import ModelConfig
    from gptforge.infer.multi_lora import load_adapter
    from gptforge.model.gpt import GPT

    base, _tok = trained
    other = GPT(ModelConfig(preset="gpt2-nano", block_size=64, vocab_size=base.config.vocab_size).resolved())
    with pytest.raises(ValueError, match=rf"fine-tuned from base {trained_run.resolve()}, whose weights .* are not "
                                         "those of the served model `other`"):
        load_adapter("sql", lora_run, other, "other")
    with pytest.raises(ValueError, match="holds no LoRA adapters"):
        load_adapter("x", trained_run, base, "tiny")


def test_http_models_load_unload_and_answers(trained, lora_run, tokenizer_file):
    from gptforge.runtime.loading import load_for_inference
    from gptforge.serve.app import ServeConfig, create_app

    base, tok = trained
    merged = load_for_inference(lora_run, "cpu")[0]
    app = create_app(copy.deepcopy(base), tokenizer_file, ServeConfig(model_name="tiny", lora_modules={"sql": str(lora_run)}))
    plain = create_app(merged, tokenizer_file, ServeConfig(model_name="merged"))
    with LiveServer(app) as srv, LiveServer(plain) as ref:
        models = httpx.get(srv.url + "/v1/models").json()["data"]
        assert [(m["id"], m["parent"]) for m in models] == [("tiny", None), ("sql", "tiny")]
        assert models[1]["root"] == str(lora_run)

        def complete(url, model):
            r = httpx.post(url + "/v1/completions", timeout=60, json={
                "model": model, "prompt": PROMPTS[0], "max_tokens": 10, "temperature": 0})
            return r.status_code, r.json()

        answer = complete(srv.url, "sql")[1]
        assert answer["choices"][0]["text"] == complete(ref.url, "merged")[1]["choices"][0]["text"]
        assert answer["model"] == "sql"  # the id the request named, as vLLM answers
        r = httpx.post(srv.url + "/v1/load_lora_adapter", json={"lora_name": "sql2", "lora_path": str(lora_run)})
        assert r.status_code == 200 and r.json()["id"] == "sql2" and r.json()["parent"] == "tiny"
        assert "sql2" in httpx.get(srv.url + "/openapi.json").json()["components"]["schemas"]["CompletionRequest"][
            "properties"]["model"]["anyOf"][0]["enum"]
        again = httpx.post(srv.url + "/v1/load_lora_adapter", json={"lora_name": "sql2", "lora_path": str(lora_run)})
        assert again.status_code == 400 and "already loaded" in again.json()["error"]["message"]
        missing = httpx.post(srv.url + "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/nonexistent"})
        assert missing.status_code == 404 and missing.json()["error"]["param"] == "lora_path"
        assert httpx.post(srv.url + "/v1/unload_lora_adapter", json={"lora_name": "sql2"}).json()["deleted"] is True
        status, body = complete(srv.url, "sql2")
        assert status == 404 and "`tiny`, `sql`" in body["error"]["message"]
        assert httpx.post(srv.url + "/v1/unload_lora_adapter", json={"lora_name": "sql2"}).status_code == 404
        assert complete(srv.url, "tiny")[0] == 200
