import pytest
import torch

from gptforge.infer.engine import Engine, SamplingParams

TOL = 1e-3  # nats: where the top-2 gap is smaller, batched rounding may pick the other token


def _run(engine, jobs, max_steps=2000):
    """Submit (prompt, params) jobs; step until all finish. Returns [(events, first_step, last_step)]."""
    out = [dict(events=[], first=None, last=None) for _ in jobs]
    for j, (prompt, params) in enumerate(jobs):
        def on_event(ev, j=j):
            o = out[j]
            o["events"].append(ev)
            o["first"] = engine.steps if o["first"] is None else o["first"]
            if ev.finish_reason:
                o["last"] = engine.steps
        engine.submit(prompt, params, on_event)
    for _ in range(max_steps):
        if not engine.step():
            break
    assert all(o["last"] is not None for o in out)
    return out


def _tokens(o):
    return [e.token_id for e in o["events"] if e.token_id is not None]


def _agree_where_decisive(alone, batched):
    """Greedy tokens must agree until the first step whose top-2 gap (run alone) is below TOL."""
    a, b = _tokens(alone), _tokens(batched)
    compared = 0
    for i, ev in enumerate(alone["events"]):
        top = ev.logprob.top
        if top[0][1] - top[1][1] < TOL:
            break
        assert a[i] == b[i], (i, a, b)
        compared += 1
    return compared


def test_greedy_alone_equals_beside_seven_others(trained, byte_tokenizer):
    model, tok = trained
    texts = ["def main():\n    ", "import os", "class Foo(object):\n    \"\"\"", "# Copyright",
             "return self", "for i in range(10):\n", "x", "if __name__ == '__main__':\n    main()\n"]
    prompts = [tok.encode(t) for t in texts]
    params = [SamplingParams(max_tokens=6 + 3 * i, temperature=0, logprobs=2) for i in range(8)]
    alone = [_run(Engine(model, tok.decode, max_batch_size=1), [(p, q)])[0] for p, q in zip(prompts, params, strict=True)]
    together = _run(Engine(model, tok.decode, max_batch_size=8), list(zip(prompts, params, strict=True)))
    compared = 0
    for a, b, q in zip(alone, together, params, strict=True):
        assert len(_tokens(b)) == q.max_tokens and b["events"][-1].finish_reason == "length"
        compared += _agree_where_decisive(a, b)
    assert compared > 40  # most steps were decisive: the comparison means something
    # All eight ran at once: each started in the first step.
    assert {b["first"] for b in together} == {1}


def test_requests_queue_in_order_and_start_when_a_slot_frees(trained):
    model, tok = trained
    eng = Engine(model, tok.decode, max_batch_size=2)
    p = tok.encode("def f(x):")
    jobs = [(p, SamplingParams(max_tokens=n, temperature=0)) for n in (3, 20, 5, 4)]
    a, b, c, d = _run(eng, jobs)
    assert a["first"] == b["first"] == 1
    assert c["first"] == a["last"] + 1 < b["last"]  # joined the running batch, did not wait for b
    assert d["first"] == c["last"] + 1 < b["last"]
    assert eng.free_slots and sorted(eng.free_slots) == [0, 1] and not eng.running


def test_cancel_frees_the_slot_and_the_next_request_starts(trained):
    model, tok = trained
    eng = Engine(model, tok.decode, max_batch_size=1)
    seen = []
    first = eng.submit(tok.encode("import"), SamplingParams(max_tokens=30, temperature=0), seen.append)
    second = []
    eng.submit(tok.encode("import"), SamplingParams(max_tokens=2, temperature=0), second.append)
    eng.step()
    eng.step()
    eng.cancel(first)
    eng.step()  # the cancelled request leaves, the queued one is prefilled in the same step
    assert len(seen) == 2 and len(second) == 1
    while eng.step():
        pass
    assert second[-1].finish_reason == "length" and len(seen) == 2 and eng.free_slots == [0]


def test_prompt_logprobs_match_a_full_forward_and_max_tokens_zero_scores_only(trained):
    model, tok = trained
    eng = Engine(model, tok.decode, max_batch_size=2)
    prompt = tok.encode("def add(a, b):\n    return a + b\n")
    (o,) = _run(eng, [(prompt, SamplingParams(max_tokens=0, prompt_logprobs=3))])
    (ev,) = o["events"]
    assert ev.token_id is None and ev.finish_reason == "length" and ev.prompt_logprobs[0] is None
    with torch.no_grad():
        ref = model(torch.tensor([prompt]))[0].float().log_softmax(-1)
    for t, lp in enumerate(ev.prompt_logprobs[1:]):
        assert lp.token_id == prompt[t + 1]
        assert lp.logprob == pytest.approx(float(ref[t, prompt[t + 1]]), abs=1e-4)
        assert len(lp.top) == 3 and lp.top[0][1] >= lp.top[1][1] >= lp.top[2][1]


def test_stop_strings_seeds_and_penalties(trained):
    model, tok = trained
    eng = Engine(model, tok.decode, max_batch_size=4)
    p = tok.encode("def main():\n")
    (free,) = _run(eng, [(p, SamplingParams(max_tokens=24, temperature=0))])
    text = "".join(e.text for e in free["events"])
    assert text == tok.decode(_tokens(free))
    stop = text[5:8]
    (cut,) = _run(eng, [(p, SamplingParams(max_tokens=24, temperature=0, stop=[stop]))])
    assert "".join(e.text for e in cut["events"]) == text[: text.find(stop)]
    assert cut["events"][-1].finish_reason == "stop"
    s1, s2, s3 = _run(eng, [(p, SamplingParams(max_tokens=12, temperature=1.0, seed=s)) for s in (7, 7, 8)])
    assert _tokens(s1) == _tokens(s2) != _tokens(s3)
    (pen,) = _run(eng, [(p, SamplingParams(max_tokens=24, temperature=0, frequency_penalty=2.0))])
    assert len(set(_tokens(pen))) > len(set(_tokens(free)))


def test_a_request_longer_than_the_context_is_refused(trained):
    model, tok = trained
    eng = Engine(model, tok.decode, max_batch_size=1, max_model_len=32)
    with pytest.raises(ValueError, match="20 tokens and max_tokens is 13"):
        eng.submit(list(range(1, 21)), SamplingParams(max_tokens=13), lambda ev: None)
    with pytest.raises(ValueError, match="block_size 64"):
        Engine(model, tok.decode, max_model_len=65)


def test_a_failed_prefill_answers_its_request_and_frees_the_slot(trained, monkeypatch):
    import threading

    model, tok = trained
    eng = Engine(model, tok.decode, max_batch_size=1)
    real_prefill = eng._prefill
    calls = {"n": 0}

    def failing_once(seqs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected prefill failure")
        return real_prefill(seqs)

    monkeypatch.setattr(eng, "_prefill", failing_once)
    done = [threading.Event(), threading.Event()]
    events: list[list] = [[], []]

    def on_event(i):
        def cb(ev):
            events[i].append(ev)
            if ev.finish_reason:
                done[i].set()
        return cb

    eng.start()
    try:
        eng.submit(tok.encode("import"), SamplingParams(max_tokens=3, temperature=0), on_event(0))
        assert done[0].wait(60), "the request whose prefill failed was never answered"
        assert events[0][-1].finish_reason == "error" and "injected prefill failure" in events[0][-1].error
        eng.submit(tok.encode("import"), SamplingParams(max_tokens=3, temperature=0), on_event(1))
        assert done[1].wait(60), "the slot of the failed request was not freed"
        assert events[1][-1].finish_reason == "length"
    finally:
        eng.stop()
    assert eng.free_slots == [0] and not eng.running


def test_requests_admitted_together_share_one_prefill_pass_and_stats_count_them(trained):
    model, tok = trained
    eng = Engine(model, tok.decode, max_batch_size=4)
    prompts = [tok.encode(t) for t in ("import os", "x", "def main():\n    return 1", "class A:")]
    assert len({len(p) for p in prompts}) > 1  # different lengths: the pass pads
    jobs = [(p, SamplingParams(max_tokens=3, temperature=0, logprobs=2)) for p in prompts]
    jobs.append((prompts[0], SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=0)))  # waits for a slot
    out = _run(eng, jobs)
    st = eng.stats
    # Step 1 admits the four plain requests in one pass; the prompt_logprobs one, admitted later,
    # gets a pass of its own (it needs the logits of every prompt position).
    assert (st.prefill_passes, st.prefill_sequences) == (2, 5)
    assert st.decode_rows == sum(q.max_tokens - 1 for _, q in jobs)  # the first token comes from the prefill
    assert st.steps == eng.steps and st.seconds >= st.prefill_seconds + st.decode_seconds > 0
    assert [len(_tokens(o)) for o in out] == [3, 3, 3, 3, 2]
    # The padded pass gives each prompt the greedy continuation it gets alone (where not a near-tie).
    compared = 0
    for (p, q), o in zip(jobs[:4], out, strict=False):
        compared += _agree_where_decisive(_run(Engine(model, tok.decode, max_batch_size=1), [(p, q)])[0], o)
    assert compared >= 8


def test_step_hooks_run_once_per_step_after_its_events(trained):
    model, tok = trained
    eng = Engine(model, tok.decode, max_batch_size=2)
    log: list[str] = []
    eng.step_hooks.append(lambda: log.append("hook"))
    for t in ("import", "x"):
        eng.submit(tok.encode(t), SamplingParams(max_tokens=2, temperature=0), lambda ev: log.append("event"))
    while eng.step():
        pass
    assert log == ["event", "event", "hook"] * 2  # two steps: prefill (+ first tokens), then the last tokens
