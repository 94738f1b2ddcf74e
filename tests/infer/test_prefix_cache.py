"""Prefix reuse in the engine (gptforge.infer.prefix_cache): what is reused, from where, what is
evicted, and that the outputs equal those of a full prefill (issue 45's near-tie rule)."""

import torch

from gptforge.infer.engine import Engine, SamplingParams
from gptforge.infer.prefix_cache import common_prefix, prefill_groups
from tests.infer.near_tie import event_tokens_and_gaps, greedy_flip

CODE = ("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
        "class Point(object):\n    def __init__(self, x, y):\n        self.x = x\n")


def _run(engine, prompt, **params):
    """Submit one request and step until it ends: its events."""
    events: list = []
    engine.submit(prompt, SamplingParams(**{"temperature": 0, "logprobs": 2, **params}), events.append)
    while not (events and events[-1].finish_reason):
        engine.step()
    return events


def test_common_prefix_and_prefill_groups():
    assert common_prefix([1, 2, 3, 4], [1, 2, 5]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2 and common_prefix([], [1]) == 0 and common_prefix([7], [8]) == 0
    long = list(range(1000))
    assert common_prefix(long, long[:700] + [-1] + long[701:]) == 700

    class S:
        def __init__(self, n, cached):
            self.prompt, self.cached = [0] * n, cached

    rows = [S(60, 50), S(40, 0), S(10, 0)]
    groups = prefill_groups(rows, 64)
    # 50 cached + the 40-token tail of another row would pass position 64: two passes.
    assert [[len(s.prompt) for s in g] for g in groups] == [[40, 10], [60]]
    assert prefill_groups(rows, 100) == [[rows[1], rows[2], rows[0]]]


def test_a_shared_prefix_is_reused_and_the_output_equals_a_full_prefill(trained):
    model, tok = trained
    ids = tok.encode(CODE)[:40]
    first, second = ids[:30] + tok.encode(" x"), ids[:30] + tok.encode("\n\nimport os")
    assert len(first) < 40 and len(second) < 40
    ref = Engine(model, tok.decode, max_batch_size=2, prefix_caching=False)
    eng = Engine(model, tok.decode, max_batch_size=2)
    compared = flips = 0
    for prompt in (first, second, second):
        want, gaps = event_tokens_and_gaps(_run(ref, prompt, max_tokens=20))
        got_events = _run(eng, prompt, max_tokens=20)
        n, flipped = greedy_flip(want, gaps, event_tokens_and_gaps(got_events)[0])
        compared, flips = compared + n, flips + flipped
    assert compared >= 55 and flips <= 1  # a trained model: its greedy choices are rarely near-ties
    assert ref.stats.prefix_hit_tokens == 0
    # first: nothing cached; second: the 30 shared tokens; second again: all but its last token.
    assert got_events[0].cached_tokens == len(second) - 1
    assert eng.stats.prefix_hit_tokens == 30 + len(second) - 1
    assert eng.stats.prefix_query_tokens == len(first) + 2 * len(second)


def test_a_running_sequence_lends_its_prefix_and_prompt_logprobs_never_reuse(trained):
    model, tok = trained
    eng = Engine(model, tok.decode, max_batch_size=2)
    ids = tok.encode(CODE)[:30]
    a: list = []
    eng.submit(ids, SamplingParams(max_tokens=25, temperature=0), a.append)
    eng.step()  # a is prefilled and runs in slot 0
    b = _run(eng, ids[:20] + tok.encode(" y"), max_tokens=3)
    assert b[0].cached_tokens == 20 and not a[-1].finish_reason  # copied from a's running slot
    c = _run(eng, ids, max_tokens=1, prompt_logprobs=1)
    assert c[0].cached_tokens == 0 and c[0].prompt_logprobs is not None


def test_spare_slots_keep_prefixes_with_lru_eviction(trained):
    model, tok = trained
    ids = tok.encode(CODE)
    a, c, d = ids[:30], tok.encode("import sys\nimport os\n"), tok.encode("x = [1, 2, 3]\n")
    a2 = a[:25] + tok.encode(" zz")
    no_spare = Engine(model, tok.decode, max_batch_size=1)
    for p in (a, c):
        _run(no_spare, p, max_tokens=2)
    assert _run(no_spare, a2, max_tokens=2)[0].cached_tokens == 0  # c overwrote a's only slot
    spare = Engine(model, tok.decode, max_batch_size=1, prefix_cache_slots=1)
    for p in (a, c):
        _run(spare, p, max_tokens=2)
    assert _run(spare, a2, max_tokens=2)[0].cached_tokens == 25  # a moved to the spare slot
    for p in (c, d):  # a2 (in the spare) is the least recently used: c, then d, replace it
        _run(spare, p, max_tokens=2)
    assert _run(spare, a2, max_tokens=2)[0].cached_tokens == 0
    assert spare.prefix.tokens[0] == a2 + spare.prefix.tokens[0][len(a2):]  # slot 0 holds a2 + its output


def test_random_weights_differ_from_a_full_prefill_only_at_near_ties():
    from gptforge.config import ModelConfig
    from gptforge.model.gpt import GPT

    torch.manual_seed(0)
    model = GPT(ModelConfig(arch="llama", n_layer=2, n_head=4, n_kv_head=2, d_model=64, block_size=128,
                            vocab_size=97).resolved()).eval()
    g = torch.Generator().manual_seed(1)
    system = torch.randint(0, 97, (60,), generator=g).tolist()
    tails = [torch.randint(0, 97, (k,), generator=g).tolist() for k in (1, 5, 17, 33)]
    decode = str
    ref = Engine(model, decode, max_batch_size=3, prefix_caching=False)
    eng = Engine(model, decode, max_batch_size=3, prefix_cache_slots=2)
    compared = flips = 0
    for tail in tails:
        want, gaps = event_tokens_and_gaps(_run(ref, system + tail, max_tokens=30))
        n, flipped = greedy_flip(want, gaps, event_tokens_and_gaps(_run(eng, system + tail, max_tokens=30))[0])
        compared, flips = compared + n, flips + flipped
    assert eng.stats.prefix_hit_tokens == 60 * 3
    assert compared >= 90, (compared, flips)


def test_a_failed_step_forgets_cached_prefixes(trained, monkeypatch):
    import threading

    model, tok = trained
    eng = Engine(model, tok.decode, max_batch_size=2)
    _run(eng, tok.encode(CODE)[:20], max_tokens=2)
    assert eng.prefix.tokens[0]  # the finished request's slot keeps its tokens

    def failing(seqs):
        raise RuntimeError("injected decode failure")

    monkeypatch.setattr(eng, "_decode", failing)
    done = threading.Event()
    events: list = []
    eng.start()
    try:
        eng.submit(tok.encode("import os"), SamplingParams(max_tokens=5, temperature=0),
                   lambda ev: (events.append(ev), ev.finish_reason and done.set()))
        assert done.wait(60)
    finally:
        eng.stop()
    assert events[-1].finish_reason == "error" and not any(eng.prefix.tokens)
