"""Task file formats as published, YAML definitions, few-shot draws, and bad input named by file/line/field."""

import json

import pytest

from gptforge.errors import InputError, MissingInputError
from gptforge.eval.runner import fewshot_contexts, run_task
from gptforge.eval.tasks import load_task


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_generic_multiple_choice_label_by_index_or_text(tmp_path):
    t = load_task(_jsonl(tmp_path / "mc.jsonl", [
        {"context": "2 + 2 =", "choices": ["3", "4"], "label": 1},
        {"context": "The sky is ", "choices": ["blue", "green"], "label": "blue"}]))
    assert (t.type, t.format, t.name) == ("multiple_choice", "mc", "mc")
    e = t.examples[0]
    assert e.contexts == ["2 + 2 ="] and e.continuations == [" 3", " 4"] and e.label == 1
    assert e.choice_lengths == [1, 1] and e.demo == "2 + 2 = 4"
    assert t.examples[1].label == 0
    assert t.chance == pytest.approx(0.5)


def test_hellaswag_row_is_preprocessed_as_lm_eval(tmp_path):
    row = {"ind": 4, "activity_label": "Removing ice from car", "ctx_a": "Then, the man writes over the snow.",
           "ctx_b": "then", "endings": [", the man [title] adds wax.", " leaves.", " waits.", " stops."],
           "label": "3"}
    e = load_task(_jsonl(tmp_path / "hs.jsonl", [row])).examples[0]
    assert e.contexts == ["Removing ice from car: Then, the man writes over the snow. Then"]
    assert e.continuations[0] == " , the man. adds wax."  # " [title]" -> ". ", stripped
    assert e.label == 3


def test_arc_mmlu_piqa_winogrande(tmp_path):
    arc = load_task(_jsonl(tmp_path / "arc.jsonl", [{"id": "q1", "question": {"stem": "Which is a gas?", "choices": [
        {"text": "ice", "label": "A"}, {"text": "steam", "label": "B"}]}, "answerKey": "B"}])).examples[0]
    assert arc.contexts == ["Question: Which is a gas?\nAnswer:"] and arc.label == 1
    assert arc.continuations == [" ice", " steam"]

    (tmp_path / "data" / "test").mkdir(parents=True)
    (tmp_path / "data" / "dev").mkdir()
    (tmp_path / "data" / "test" / "high_school_math_test.csv").write_text('"What is 1+1?",1,2,3,4,B\n')
    (tmp_path / "data" / "dev" / "high_school_math_dev.csv").write_text("What is 2+2?,3,4,5,6,B\nWhat is 0?,0,1,2,3,A\n")
    mmlu = load_task(tmp_path / "data" / "test" / "high_school_math_test.csv")
    assert mmlu.format == "mmlu" and mmlu.examples[0].label == 1
    assert mmlu.examples[0].contexts == ["What is 1+1?\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer:"]
    assert mmlu.examples[0].continuations == [" A", " B", " C", " D"]
    assert mmlu.fewshot_pool is not None and len(mmlu.fewshot_pool) == 2 and mmlu.fewshot_sampler == "first_n"
    ctx = fewshot_contexts(mmlu, 0, 1, seed=0)[0]
    assert ctx.startswith("The following are multiple choice questions (with answers) about high school math.\n\n"
                          "What is 2+2?\nA. 3\nB. 4")
    assert "Answer: B\n\nWhat is 1+1?" in ctx

    piqa = load_task(_jsonl(tmp_path / "piqa.jsonl", [{"goal": "Open a jar", "sol1": "twist", "sol2": "lick",
                                                       "label": 0}])).examples[0]
    assert piqa.contexts == ["Question: Open a jar\nAnswer:"] and piqa.continuations == [" twist", " lick"]

    wino = load_task(_jsonl(tmp_path / "w.jsonl", [{"sentence": "Sam gave Tom a book because _ was kind.",
                                                    "option1": "Sam", "option2": "Tom", "answer": "1"}]))
    e = wino.examples[0]
    assert e.contexts == ["Sam gave Tom a book because Sam", "Sam gave Tom a book because Tom"]
    assert e.continuations == [" was kind.", " was kind."] and e.label == 0


def test_classification_yaml_with_verbalizers(tmp_path, loaded):
    _jsonl(tmp_path / "rev.jsonl", [{"text": "import os", "label": "code"}, {"text": "Hello there", "label": "prose"},
                                    {"text": "def f(x):", "label": "code"}])
    (tmp_path / "rev.yaml").write_text("name: kind\ndata: rev.jsonl\nprompt: \"Text: {text}\\nKind:\"\n"
                                       "labels: {code: python, prose: english}\n")
    t = load_task(tmp_path / "rev.yaml")
    assert t.name == "kind" and t.type == "classification" and t.labels == ["code", "prose"]
    assert t.examples[1].contexts == ["Text: Hello there\nKind:"]
    assert t.examples[1].continuations == [" python", " english"] and t.examples[1].label == 1
    model, tok = loaded
    r = run_task(model, tok, t)
    assert set(r.metrics) >= {"acc", "macro_f1", "micro_f1", "precision/code", "recall/prose", "f1/code"}
    assert sum(map(sum, r.confusion_matrix["matrix"])) == 3
    assert all(rec["n"] is not None and rec["stderr"] is not None for rec in r.metrics.values())


def test_generation_and_cloze_run(tmp_path, loaded):
    model, tok = loaded
    gen = _jsonl(tmp_path / "gen.jsonl", [{"prompt": "import", "answer": [" os", "sys"]},
                                          {"prompt": "def", "answer": "main"}])
    (tmp_path / "gen.yaml").write_text("data: gen.jsonl\nmax_new_tokens: 4\nstop: ['\\n']\n")
    r = run_task(model, tok, tmp_path / "gen.yaml")
    assert r.type == "generation" and r.n == 2 and set(r.metrics) == {"exact_match", "f1"}
    assert all("\n" not in p["output"] for p in r.predictions)
    assert 0 <= r.metrics["f1"]["value"] <= 1
    # Prompts of different lengths batched together (left-padded) give the outputs they give alone.
    assert [p["output"] for p in run_task(model, tok, tmp_path / "gen.yaml", batch_size=1).predictions] == \
        [p["output"] for p in r.predictions]
    cl = run_task(model, tok, _jsonl(tmp_path / "lambada.jsonl", [{"text": "for i in range(10)"},
                                                                   {"text": "return self"}]))
    assert cl.type == "cloze" and cl.metrics["perplexity"]["value"] > 1 and cl.metrics["acc"]["n"] == 2
    assert gen.exists()


def test_fewshot_draw_is_fixed_by_seed_and_excludes_the_example(tmp_path):
    rows = [{"context": f"q{i}", "choices": ["a", "b"], "label": i % 2} for i in range(10)]
    t = load_task(_jsonl(tmp_path / "mc.jsonl", rows))
    a = fewshot_contexts(t, 3, 3, seed=7)[0]
    assert a == fewshot_contexts(t, 3, 3, seed=7)[0]
    assert a != fewshot_contexts(t, 3, 3, seed=8)[0]
    shots = a.split("\n\n")
    assert len(shots) == 4 and shots[-1] == "q3" and "q3 " not in a
    with pytest.raises(InputError, match="only 9 few-shot candidates"):
        fewshot_contexts(t, 0, 10, seed=0)


@pytest.mark.parametrize("rows,match", [
    ([{"context": "x", "choices": ["a"], "label": 0}, {"context": "y", "label": 0}], r"line 2: missing field 'choices'"),
    ([{"context": "x", "choices": ["a", "b"], "label": 2}], r"line 1: field 'label' = 2 is outside the 2 choices"),
    ([{"context": "x", "choices": ["a", "b"], "label": "c"}], r"line 1: field 'label' = 'c' is not one of the choices"),
    ([{"context": "x", "choices": [], "label": 0}], r"line 1: field 'choices' must be a non-empty list"),
    ([{"context": "x", "choices": ["a"], "label": 0}, {"prompt": "p", "answer": "a"}], r"line 2: mixed formats"),
    ([{"foo": 1}], r"line 1: row matches no task format"),
])
def test_bad_task_rows_name_file_line_and_field(tmp_path, rows, match):
    path = _jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(InputError, match=match) as e:
        load_task(path)
    assert str(path) in str(e.value)


def test_non_utf8_bad_json_missing_file_and_yaml_key(tmp_path):
    p = tmp_path / "latin.jsonl"
    p.write_bytes(b'{"context": "ok", "choices": ["a"], "label": 0}\n{"context": "caf\xe9", "choices": ["a"], "label": 0}\n')
    with pytest.raises(InputError, match=r"latin.jsonl, line 2: not UTF-8"):
        load_task(p)
    (tmp_path / "j.jsonl").write_text('{"context": "x",\n')
    with pytest.raises(InputError, match=r"j.jsonl, line 1: not valid JSON"):
        load_task(tmp_path / "j.jsonl")
    with pytest.raises(MissingInputError, match="does not exist"):
        load_task(tmp_path / "none.jsonl")
    (tmp_path / "t.yaml").write_text("data: j.jsonl\nprompts: x\n")
    with pytest.raises(InputError, match=r"unknown key 'prompts' \(did you mean 'prompt'\?\)"):
        load_task(tmp_path / "t.yaml")


def test_limit_larger_than_the_task_is_the_whole_task(tmp_path, loaded):
    model, tok = loaded
    path = _jsonl(tmp_path / "mc.jsonl", [{"context": "import", "choices": [" os", " zz"], "label": 0}] * 3)
    assert run_task(model, tok, path, limit=100).n == 3
    assert run_task(model, tok, path, limit=2).n == 2


def test_long_context_is_truncated_from_the_left_and_counted(tmp_path, loaded):
    model, tok = loaded
    long_ctx = "x = 1\n" * 200  # far beyond block_size 64
    path = _jsonl(tmp_path / "long.jsonl", [{"context": long_ctx, "choices": ["y = 2", "zz"], "label": 0},
                                            {"context": "import", "choices": [" os", " zz"], "label": 0}])
    r = run_task(model, tok, path)
    assert r.truncated == 2  # both choices of the first example
    assert r.n == 2


def test_perplexity_task_totals_match_direct_scoring(tmp_path, loaded):
    import math

    import numpy as np

    from gptforge.eval.perplexity import evaluate_tokens

    model, tok = loaded
    docs = ["import os\nimport sys\n" * 6, "def f(x):\n    return x + 1\n"]
    _jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in docs])
    (tmp_path / "ppl.yaml").write_text("data: docs.jsonl\ntype: perplexity\n")
    r = run_task(model, tok, tmp_path / "ppl.yaml")
    assert r.type == "perplexity" and r.n == 2
    nats = [evaluate_tokens(model, np.array([tok.eos_id] + tok.encode(d)), stride=64).total_nats for d in docs]
    n_bytes = sum(len(d.encode()) for d in docs)
    assert r.metrics["bits_per_byte"]["value"] == pytest.approx(sum(nats) / n_bytes / math.log(2), rel=1e-9)
    assert r.metrics["byte_perplexity"]["value"] == pytest.approx(math.exp(sum(nats) / n_bytes), rel=1e-9)
    assert r.metrics["bits_per_byte"]["stderr"] > 0
    # Without `type: perplexity` the same rows are a cloze task.
    assert load_task(tmp_path / "docs.jsonl").type == "cloze"


def test_a_continuation_longer_than_the_context_window_names_the_line(tmp_path, loaded):
    model, tok = loaded
    path = _jsonl(tmp_path / "huge.jsonl", [{"context": "import", "choices": [" os", " zz"], "label": 0},
                                            {"context": "x", "choices": ["y = 1\n" * 100, "z"], "label": 0}])
    with pytest.raises(InputError, match=r"huge.jsonl, line 2: the continuation .* longer than the model's context"):
        run_task(model, tok, path)
