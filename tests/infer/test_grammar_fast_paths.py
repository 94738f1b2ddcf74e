"""Grammar-constrained rows (issue 44) on an engine with prefix reuse and n-gram speculation (issue
45): drafts are cut where the grammar refuses them, and the output is plain constrained decoding's."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("llguidance", reason="llguidance is in the serve and test extras")

from gptforge.infer.engine import Engine, Request, SamplingParams  # noqa: E402
from gptforge.infer.grammar import Constraint, GrammarVocab, json_schema_grammar, regex_grammar  # noqa: E402
from gptforge.infer.speculative import Speculator  # noqa: E402

CODE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"
CODE_REGEX = r"(def [a-z]{1,5}\(a, b\):\n    return a [-+*] b\n\n\n){1,3}"
DIGITS_REGEX = r"[0-9]{3,12}"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 999}},
          "required": ["name", "n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def setup(trained):
    model, tok = trained
    return model, tok, GrammarVocab(tok.to_str(), model.config.vocab_size, tok.eos_id)


def test_a_draft_is_cut_at_the_first_token_the_grammar_refuses(setup):
    model, tok, vocab = setup
    prompt = tok.encode("    return a + b\n    return a - b\n    return a")
    free = Request(prompt, SamplingParams(), lambda ev: None, tok.decode, "cpu")
    draft = Speculator(4).draft(free, room=10)
    assert len(draft) >= 2, draft  # the prompt repeats itself: its suffix has an earlier occurrence
    first = tok.decode(draft[:1])
    cut = Request(prompt, SamplingParams(), lambda ev: None, tok.decode, "cpu")
    cut.constraint = Constraint(vocab, regex_grammar(re.escape(first) + "Q+", "regex"))
    assert Speculator(4).draft(cut, room=10) == draft[:1]  # the second token does not start with Q
    digits = Request(prompt, SamplingParams(), lambda ev: None, tok.decode, "cpu")
    digits.constraint = Constraint(vocab, regex_grammar(DIGITS_REGEX, "regex"))
    assert Speculator(4).draft(digits, room=10) == []
    assert digits.constraint.valid_prefix(tok.encode("12")) == len(tok.encode("12"))  # the state was kept


def _run(engine: Engine, jobs):
    """Run (prompt, params) jobs to the end; [(token ids, text, finish_reason, cached_tokens)]."""
    out = [[[], "", None, None] for _ in jobs]

    def sink(o):
        def on_event(ev):
            if ev.token_id is not None:
                o[0].append(ev.token_id)
            o[1] += ev.text
            o[2] = ev.finish_reason or o[2]
            o[3] = ev.cached_tokens if o[3] is None else o[3]
        return on_event

    for (p, params), o in zip(jobs, out, strict=True):
        engine.submit(p, params, sink(o))
    while engine.step():
        pass
    return [tuple(o) for o in out]


def test_constrained_rows_with_prefix_reuse_and_speculation_decode_as_plain(setup):
    model, tok, vocab = setup
    code = tok.encode(CODE * 2)[-40:]
    grammars = [regex_grammar(CODE_REGEX, "r"), regex_grammar(DIGITS_REGEX, "r"), json_schema_grammar(SCHEMA, "s"),
                None]
    jobs = [(code, SamplingParams(max_tokens=24, temperature=0, grammar=g, stop_token_ids=(tok.eos_id,)))
            for g in grammars]
    plain = Engine(model, tok.decode, max_batch_size=4, prefix_caching=False)
    fast = Engine(model, tok.decode, max_batch_size=4, prefix_cache_slots=2, speculative="ngram",
                  num_speculative_tokens=4)
    plain.grammar_vocab = fast.grammar_vocab = vocab
    want = _run(plain, jobs)
    first, second = _run(fast, jobs), _run(fast, jobs)  # the second run reuses the first's prompts
    assert [o[3] for o in first] == [0, 0, 0, 0]  # admitted in one step: nothing written yet
    assert all(o[3] == len(code) - 1 for o in second)
    for g, w, a, b in zip(grammars, want, first, second, strict=True):
        assert a[:3] == w[:3] and b[:3] == w[:3]
        if g is not None:  # every generated token is one the grammar allows, in order
            toks = [t for t in w[0] if t != tok.eos_id]
            assert Constraint(vocab, g).valid_prefix(toks) == len(toks)
    assert re.fullmatch(DIGITS_REGEX, want[1][1]) or want[1][2] == "length"
    assert want[0][1].startswith("def ") and want[2][1].startswith('{"name":"')
    st = fast.stats
    assert 0 < st.spec_accepted_tokens <= st.spec_draft_tokens  # the code row's forced tokens come from drafts
    assert st.prefix_hit_tokens == 4 * (len(code) - 1)
