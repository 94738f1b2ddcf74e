"""Grammar-constrained rows in the continuous-batching engine (gptforge.infer.grammar)."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("llguidance", reason="llguidance is in the serve and test extras")

from gptforge.infer.engine import Engine, SamplingParams  # noqa: E402
from gptforge.infer.grammar import (  # noqa: E402
    Constraint,
    GrammarError,
    GrammarVocab,
    check_grammar,
    choice_grammar,
    json_schema_grammar,
    lark_grammar,
    regex_grammar,
)

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                                             "maximum": 99}},
          "required": ["ok", "n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def setup(trained):
    model, tok = trained
    vocab = GrammarVocab(tok.to_str(), model.config.vocab_size, tok.eos_id)
    return model, tok, vocab


def run(model, tok, vocab, jobs, max_batch_size=4):
    """Run (prompt ids, params) jobs together; returns [(text, token ids, finish_reason)]."""
    eng = Engine(model, tok.decode, max_batch_size=max_batch_size)
    eng.grammar_vocab = vocab
    out: list[list] = [["", [], None] for _ in jobs]

    def sink(i):
        def f(ev):
            out[i][0] += ev.text
            if ev.token_id is not None:
                out[i][1].append(ev.token_id)
            out[i][2] = ev.finish_reason or out[i][2]
        return f

    for i, (p, params) in enumerate(jobs):
        eng.submit(p, params, sink(i))
    while eng.step():
        pass
    return [tuple(o) for o in out]


def test_constrained_and_free_rows_share_a_batch(setup):
    model, tok, vocab = setup
    prompt = tok.encode("def main():\n    ")
    g = json_schema_grammar(SCHEMA, "schema")
    free_alone = run(model, tok, vocab, [(prompt, SamplingParams(max_tokens=12, temperature=0))])[0]
    both = run(model, tok, vocab, [(prompt, SamplingParams(max_tokens=40, temperature=0, grammar=g,
                                                           stop_token_ids=[tok.eos_id])),
                                   (prompt, SamplingParams(max_tokens=12, temperature=0)),
                                   (prompt, SamplingParams(max_tokens=40, temperature=0.9, seed=3, grammar=g,
                                                           stop_token_ids=[tok.eos_id]))])
    assert both[1][1] == free_alone[1]  # the free row is untouched by its constrained neighbours
    for text, _ids, reason in (both[0], both[2]):
        assert reason == "stop", text
        value = json.loads(text)
        assert set(value) == {"ok", "n"} and isinstance(value["ok"], bool) and 0 <= value["n"] <= 99
        assert " " not in text and "\n" not in text  # compact JSON


def test_cut_by_max_tokens_says_length(setup):
    model, tok, vocab = setup
    g = json_schema_grammar(SCHEMA, "schema")
    text, ids, reason = run(model, tok, vocab, [(tok.encode("x"), SamplingParams(max_tokens=3, temperature=0,
                                                                                 grammar=g))])[0]
    assert reason == "length" and len(ids) == 3 and text.startswith("{")


def test_regex_and_choice_with_chinese_over_split_bytes(setup):
    model, tok, vocab = setup
    choices = ["你好世界", "👍🏽 ok", "plain"]
    for seed in range(3):
        text, _ids, reason = run(model, tok, vocab, [(tok.encode("a"), SamplingParams(
            max_tokens=30, temperature=1.0, seed=seed, grammar=choice_grammar(choices, "choice")))])[0]
        assert text in choices and reason == "stop"
    assert any(len(tok.encode(c)) > len(c) for c in choices)  # a character split over byte tokens
    text, _ids, reason = run(model, tok, vocab, [(tok.encode("a"), SamplingParams(
        max_tokens=20, temperature=0, grammar=regex_grammar(r"[0-9]{3}-[a-z]{2}", "regex")))])[0]
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", text) and reason == "stop"


def test_lark_and_gbnf_grammars(setup):
    model, tok, vocab = setup
    for grammar in ('start: "(" NUM ("+" NUM)* ")"\nNUM: /[1-9]/', 'root ::= "(" [1-9] ("+" [1-9])* ")"'):
        g = lark_grammar(grammar, "grammar")
        check_grammar(vocab, g, "grammar")
        text, _ids, reason = run(model, tok, vocab, [(tok.encode("a"), SamplingParams(
            max_tokens=30, temperature=1.0, seed=1, grammar=g))])[0]
        assert re.fullmatch(r"\([1-9](\+[1-9])*\)", text), text
        assert reason == "stop"


@pytest.mark.parametrize("make, field, words", [
    (lambda: regex_grammar("a(b", "structured_outputs.regex"), "structured_outputs.regex", "unclosed group"),
    (lambda: json_schema_grammar({"type": "foo"}, "s"), "s", "foo"),
    (lambda: json_schema_grammar([1, 2], "s"), "s", "JSON schema object"),
    (lambda: json_schema_grammar({"enum": ["x" * 40_000]}, "s"), "s", "characters long"),
    (lambda: lark_grammar("start: undefined_rule", "g"), "g", "undefined_rule"),
    (lambda: choice_grammar([], "c"), "c", "empty"),
])
def test_bad_constraints_name_their_field(setup, make, field, words):
    _model, _tok, vocab = setup
    with pytest.raises(GrammarError) as e:
        check_grammar(vocab, make(), field)
    assert e.value.field == field and words in str(e.value)


def test_a_grammar_over_the_work_limit_is_refused(setup):
    _model, _tok, vocab = setup
    # llguidance builds the lexer of this regex for seconds before its first mask
    with pytest.raises(GrammarError) as e:
        check_grammar(vocab, regex_grammar("(a{1000}){1000}", "r"), "r", timeout_s=0.05)
    assert e.value.field == "r" and "took more than 0.05 s" in str(e.value)


def test_constraint_mask_allows_stop_ids_only_where_the_grammar_accepts(setup):
    import torch

    _model, tok, vocab = setup
    c = Constraint(vocab, regex_grammar("ab+", "r"))
    stop = 7
    logits = torch.zeros(vocab.n_vocab)
    masked = c.mask(logits, [stop])
    assert masked[stop] == float("-inf") and masked[tok.eos_id] == float("-inf")
    for t in tok.encode("ab"):
        c.advance(t)
    masked = c.mask(logits, [stop])
    assert masked[stop] == 0 and masked[tok.eos_id] == 0  # "ab" may end, or go on with more b
