"""n-gram speculative decoding in the engine (gptforge.infer.speculative): proposals, and outputs
equal to plain decoding's (issue 45's near-tie rule), greedy and seeded sampling."""

import pytest

from gptforge.infer.engine import Engine, SamplingParams
from gptforge.infer.speculative import NgramIndex, make_speculator
from tests.infer.near_tie import event_tokens_and_gaps, greedy_flip

CODE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"


def test_ngram_proposals_come_from_the_latest_earlier_occurrence():
    idx = NgramIndex(n_min=2, n_max=3)
    idx.extend([1, 2])
    assert idx.propose(3) == []  # the suffix itself is no earlier occurrence
    idx.extend([3, 4, 1, 2])
    assert idx.propose(3) == [3, 4, 1]  # (1, 2) occurred at 0..1, followed by 3 4 1
    idx.extend([9, 1, 2])
    assert idx.propose(2) == [9, 1]  # the latest occurrence of (1, 2) wins
    idx.extend([9])  # (1, 2, 9), 3 tokens, occurred before: followed by 1, 2
    assert idx.propose(5) == [1, 2, 9]
    idx.extend([7])
    assert idx.propose(4) == []  # (9, 7) never seen and single tokens are not looked up
    assert make_speculator(None, 4) is None
    with pytest.raises(ValueError, match="'medusa' is unknown: use one of ngram"):
        make_speculator("medusa", 4)
    with pytest.raises(ValueError, match="num_speculative_tokens must be >= 1"):
        make_speculator("ngram", 0)


def _run(engine, jobs):
    out: list[list] = [[] for _ in jobs]
    for (prompt, params), events in zip(jobs, out, strict=True):
        engine.submit(prompt, params, events.append)
    while engine.step():
        pass
    assert all(e and e[-1].finish_reason for e in out)
    return out


def test_greedy_speculation_equals_plain_decoding_and_accepts_drafts(trained):
    model, tok = trained
    prompts = [tok.encode(CODE * k) for k in (1, 2)] + [tok.encode("import os\nimport sys\nimport")]
    prompts = [p[-40:] for p in prompts]
    jobs = [(p, SamplingParams(max_tokens=24 - 3 * i, temperature=0, logprobs=2)) for i, p in enumerate(prompts)]
    plain = _run(Engine(model, tok.decode, max_batch_size=3), jobs)
    eng = Engine(model, tok.decode, max_batch_size=3, speculative="ngram", num_speculative_tokens=4)
    spec = _run(eng, jobs)
    compared = flips = 0
    for (_p, q), a, b in zip(jobs, plain, spec, strict=True):
        want, gaps = event_tokens_and_gaps(a)
        got = event_tokens_and_gaps(b)[0]
        n, flipped = greedy_flip(want, gaps, got)
        compared, flips = compared + n, flips + flipped
        assert len(got) == q.max_tokens and b[-1].finish_reason == "length"
        assert "".join(e.text for e in b) == tok.decode(got)
    assert compared >= 50 and flips <= 1
    st = eng.stats
    assert st.spec_draft_tokens > 0 and 0 < st.spec_accepted_tokens <= st.spec_draft_tokens
    # Accepted drafts made tokens without passes of their own.
    assert st.decode_passes < sum(q.max_tokens - 1 for _, q in jobs)


def test_seeded_sampling_stops_and_the_context_end_are_kept(trained):
    model, tok = trained
    p = tok.encode(CODE * 2)[-50:]
    sampled = SamplingParams(max_tokens=12, temperature=1.0, seed=3)
    greedy = _run(Engine(model, tok.decode), [(p, SamplingParams(max_tokens=13, temperature=0))])[0]
    text = "".join(e.text for e in greedy)
    stop = text[6:9]
    jobs = [(p, sampled), (p, SamplingParams(max_tokens=13, temperature=0, stop=[stop])),
            (p, SamplingParams(max_tokens=14, temperature=0))]  # 50 + 14 = the whole context of 64
    plain = _run(Engine(model, tok.decode, max_batch_size=3), jobs)
    spec = _run(Engine(model, tok.decode, max_batch_size=3, speculative="ngram", num_speculative_tokens=5), jobs)
    ids = [[e.token_id for e in evs if e.token_id is not None] for evs in spec]
    assert ids[0] == [e.token_id for e in plain[0] if e.token_id is not None]  # the same random stream
    assert "".join(e.text for e in spec[1]) == text[:text.find(stop)] and spec[1][-1].finish_reason == "stop"
    assert len(ids[2]) == 14 and spec[2][-1].finish_reason == "length"


def test_generate_command_with_speculation_prints_the_plain_greedy_text(trained_run, capsys):
    from gptforge.cli import main

    args = ["generate", str(trained_run), "--prompt", CODE[:60], "--temperature", "0", "--max-new-tokens", "16"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main(args + ["--speculative", "ngram", "--num-speculative-tokens", "3"]) == 0
    out = capsys.readouterr()
    assert out.out == plain and "draft tokens accepted" in out.err
    assert main(args + ["--speculative", "ngram", "--compile"]) != 0
    assert "not with --compile: drop one of them" in capsys.readouterr().err
    assert main(args[:-1] + ["60", "--speculative", "ngram"]) != 0
    assert "+ --max-new-tokens 60 exceed the model's 64; lower --max-new-tokens" in capsys.readouterr().err


def test_a_sequence_whose_drafts_fail_backs_off():
    idx = NgramIndex()
    idx.extend([1, 2, 3, 1, 2])
    assert idx.propose(2) == [3, 1]
    idx.verified(0)
    assert (idx.misses, idx.skip) == (1, 1)
    idx.verified(0)
    idx.verified(0)
    assert idx.skip == 4
    for _ in range(6):
        idx.verified(0)
    assert idx.skip == 16  # MAX_BACKOFF
    idx.verified(2)
    assert (idx.misses, idx.skip) == (0, 0)
