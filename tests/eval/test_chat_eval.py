"""`gptforge evaluate --chat`: tasks rendered through the model's chat template (the same token ids
as transformers' apply_chat_template on the exported model), letter scoring that agrees with the
written log-likelihoods, generation checked on extracted answers with pass@k, ChatCORE, in-loop
chat scores during finetune, and one-line errors."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from gptforge.cli import main
from gptforge.eval.chat import LETTERS, MC_INSTRUCTION, chat_messages, load_chat_format
from gptforge.eval.metrics import pass_at_k
from gptforge.eval.tasks import load_task
from tests.eval.conftest import write_mc_task

GSM8K = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
     "answer": "Tom has 3 + 4 = <<3+4=7>>7 apples.\n#### 7"},
    {"question": "A box holds 1,200 pens; 200 are sold. How many are left?",
     "answer": "1,200 - 200 = <<1200-200=1000>>1000 pens are left.\n#### 1,000"},
    {"question": "Ann reads 5 pages a day for 6 days. How many pages?",
     "answer": "5 * 6 = <<5*6=30>>30\n#### 30"},
]


def _chat_rows(n: int = 32) -> list[dict]:
    """Short synthetic chat rows (the nano model's context is 64 tokens of a 384-token vocabulary):
    three numbers, answered by the letter of the largest."""
    rng = random.Random(0)
    rows = []
    for _ in range(n):
        nums = rng.sample(range(10, 99), 3)
        rows.append({"messages": [{"role": "user", "content": " ".join(map(str, nums))},
                                  {"role": "assistant", "content": LETTERS[nums.index(max(nums))]}]})
    return rows


@pytest.fixture(scope="module")
def chat_run(trained_run, tmp_path_factory) -> Path:
    """gpt2-nano fine-tuned 4 steps on chat rows: its run directory holds the built-in template."""
    root = tmp_path_factory.mktemp("chateval")
    data = root / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _chat_rows()))
    run = root / "run"
    assert main(["finetune", "--from", str(trained_run), "--data", str(data), "--out", str(run),
                 "--train.max_steps", "4", "--train.micro_batch_size", "4", "--finetune.block_size", "64",
                 "--train.eval_interval", "0", "--train.tensorboard", "false", "--train.device", "cpu",
                 "--train.warmup_steps", "1", "--quiet"]) == 0
    return run


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chattasks")
    gsm = root / "gsm8k.jsonl"
    gsm.write_text("".join(json.dumps(r) + "\n" for r in GSM8K))
    gen = root / "gen.jsonl"
    gen.write_text("".join(json.dumps({"prompt": f"What is {a} plus {b}?", "answer": str(a + b)}) + "\n"
                           for a, b in [(1, 2), (3, 4), (10, 20), (7, 8)]))
    gen_yaml = root / "gen.yaml"
    gen_yaml.write_text("data: gen.jsonl\nmax_new_tokens: 6\n")
    return {"mc": write_mc_task(root / "mc.jsonl", n=6, n_choices=3), "gsm8k": gsm, "gen": gen_yaml}


def _hf_ids(hf_tok, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    text = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return hf_tok(text, add_special_tokens=False)["input_ids"]


def test_mc_and_gsm8k_items_render_as_transformers_renders_them(chat_run, tasks, tmp_path):
    transformers = pytest.importorskip("transformers")
    hf = tmp_path / "hf"
    assert main(["export", str(chat_run), "--format", "hf", "--out", str(hf)]) == 0
    hf_tok = transformers.AutoTokenizer.from_pretrained(hf)
    fmt = load_chat_format(str(chat_run), chat_run / "tokenizer.json")
    hf_fmt = load_chat_format(str(hf), hf / "tokenizer.json")  # the template from tokenizer_config.json
    mc, gsm = load_task(tasks["mc"]), load_task(tasks["gsm8k"])
    assert gsm.format == "gsm8k" and gsm.type == "generation" and gsm.stop == ["Question:"]
    for task, index in ((mc, 1), (gsm, 2)):
        messages = chat_messages(task, index, num_fewshot=1, seed=7)
        assert [m["role"] for m in messages] == ["user", "assistant", "user"]  # few-shot as an earlier turn
        ids = fmt.prompt_ids(messages)
        assert ids == _hf_ids(hf_tok, messages, True) == hf_fmt.prompt_ids(messages)
    ex = mc.examples[1]
    last = chat_messages(mc, 1)[-1]["content"]
    assert all(f"\n{LETTERS[i]}. {c.strip()}\n" in last for i, c in enumerate(ex.choices)) and last.endswith(MC_INSTRUCTION)
    assert chat_messages(gsm, 2, 1, 7)[1]["content"].endswith("#### 30") or "####" in chat_messages(gsm, 2, 1, 7)[1]["content"]
    assert chat_messages(gsm, 0)[-1]["content"] == GSM8K[0]["question"]  # the bare question, no "Question:"
    # The letter is scored where the assistant reply starts: context + letter is what transformers
    # renders for the conversation answered by that letter.
    messages = chat_messages(mc, 1)
    gold = LETTERS[ex.label]
    full = _hf_ids(hf_tok, messages + [{"role": "assistant", "content": gold}], False)
    head = fmt.prompt_ids(messages) + fmt.reply_ids(gold)
    assert full[:len(head)] == head
    # The exported folder scores through its own template (tokenizer_config.json) as the run does.
    lls = {}
    for name, model in (("run", chat_run), ("hf", hf)):
        out = tmp_path / f"{name}.json"
        assert main(["evaluate", str(model), "--tasks", str(tasks["mc"]), "--chat", "--out", str(out), "--quiet"]) == 0
        lls[name] = [p["loglikelihoods"] for p in json.loads(out.with_name(f"{name}.predictions.json").read_text())["mc"]]
    assert np.allclose(lls["run"], lls["hf"], atol=1e-3) and len(lls["hf"]) == 6


def _direct_loglikelihood(model, ctx: list[int], cont: list[int]) -> float:
    """Sum of log p(cont | ctx) from one plain forward pass (no packing)."""
    block = model.config.block_size
    seq = (ctx + cont)[-(block + 1):]
    x = torch.tensor([seq[:-1]])
    with torch.no_grad():
        logp = model(x).float().log_softmax(-1)[0]
    n = len(cont)
    return float(sum(logp[len(seq) - 1 - n + j, cont[j]] for j in range(n)))


def test_letter_scores_agree_with_the_written_loglikelihoods(chat_run, tasks, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["evaluate", str(chat_run), "--tasks", str(tasks["mc"]), "--chat", "--num-fewshot", "1",
                 "--out", str(out), "--quiet"]) == 0
    table = capsys.readouterr().out
    assert "mc (chat)" in table
    doc = json.loads(out.read_text())
    rec = doc["tasks"]["mc"]
    assert rec["chat"] is True and "acc_norm" not in rec["metrics"] and doc["chat"]["template"] == "auto"
    preds = json.loads(out.with_name("r.predictions.json").read_text())["mc"]
    task = load_task(tasks["mc"])
    assert all(len(p["loglikelihoods"]) == 3 and p["pred"] == int(np.argmax(p["loglikelihoods"])) for p in preds)
    acc = np.mean([p["pred"] == e.label for p, e in zip(preds, task.examples, strict=True)])
    assert rec["metrics"]["acc"]["value"] == pytest.approx(acc) and rec["chance"] == pytest.approx(1 / 3)
    from gptforge.runtime.loading import load_for_inference

    model, _, _, _ = load_for_inference(chat_run, "cpu")
    fmt = load_chat_format(str(chat_run), chat_run / "tokenizer.json")
    for i in (0, 3):
        ctx = fmt.prompt_ids(chat_messages(task, i, 1, 1234))
        for j, letter in enumerate("ABC"):
            want = _direct_loglikelihood(model, ctx, fmt.reply_ids(letter))
            assert preds[i]["loglikelihoods"][j] == pytest.approx(want, abs=1e-3)


def test_generation_is_checked_on_the_extracted_answer_with_pass_at_k(chat_run, tasks, tmp_path):
    from gptforge.eval.answers import answers_match, reply_answer

    out = tmp_path / "g.json"
    assert main(["evaluate", str(chat_run), "--tasks", str(tasks["gen"]), str(tasks["mc"]), "--chat",
                 "--out", str(out), "--quiet"]) == 0
    doc = json.loads(out.read_text())
    preds = json.loads(out.with_name("g.predictions.json").read_text())["gen"]
    refs = ["3", "7", "30", "15"]
    for p, ref in zip(preds, refs, strict=True):
        assert p["answer"] == reply_answer(p["output"])
        assert p["correct"] == int(answers_match(p["answer"], ref))
    em = doc["tasks"]["gen"]["metrics"]["exact_match"]["value"]
    assert em == pytest.approx(np.mean([p["correct"] for p in preds]))
    mc = doc["tasks"]["mc"]
    core = doc["aggregate"]["chatcore"]["value"]
    want = (em + (mc["metrics"]["acc"]["value"] - 1 / 3) / (2 / 3)) / 2
    assert core == pytest.approx(want) and "core" not in doc["aggregate"]

    assert main(["evaluate", str(chat_run), "--tasks", str(tasks["gen"]), "--chat", "--num-samples", "3",
                 "--temperature", "1.0", "--out", str(out), "--quiet"]) == 0
    doc = json.loads(out.read_text())
    m = doc["tasks"]["gen"]["metrics"]
    preds = json.loads(out.with_name("g.predictions.json").read_text())["gen"]
    assert set(m) == {"exact_match", "pass@1", "pass@2", "pass@3"} and doc["chat"]["num_samples"] == 3
    for p, ref in zip(preds, refs, strict=True):
        assert len(p["outputs"]) == 3 and p["correct"] == sum(answers_match(a, ref) for a in p["answers"])
    for k in (1, 2, 3):
        assert m[f"pass@{k}"]["value"] == pytest.approx(np.mean([pass_at_k(3, p["correct"], k) for p in preds]))
    assert m["pass@1"]["value"] == pytest.approx(m["exact_match"]["value"])


@pytest.mark.parametrize("reply, answer", [
    ("red", "red"), ("  Paris.\n", "paris"), ("It is 5 + 7 = 12.\n#### 12", "12"), ("答案：北京", "北京"),
    ("The colour is red\nand blue", None), ("", None),
])
def test_a_reply_answer_is_the_extracted_answer_or_a_one_line_reply(reply, answer):
    from gptforge.eval.answers import reply_answer

    assert reply_answer(reply) == answer


def test_pass_at_k_is_chen_et_als_unbiased_estimator():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                want = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4) and pass_at_k(5, 2, 2) == pytest.approx(0.7)
    with pytest.raises(ValueError, match="k=6"):
        pass_at_k(5, 1, 6)


def test_in_loop_chat_scores_pick_the_best_checkpoint(trained_run, tasks, tmp_path):
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _chat_rows(16)))
    run = tmp_path / "run"
    assert main(["finetune", "--from", str(trained_run), "--data", str(data), "--out", str(run),
                 "--train.max_steps", "4", "--train.micro_batch_size", "4", "--finetune.block_size", "64",
                 "--train.eval_interval", "2", "--train.eval_tasks", json.dumps([str(tasks["mc"]), str(tasks["gen"])]),
                 "--train.eval_chat", "true", "--train.best_metric", "eval/chatcore/centered_acc",
                 "--train.tensorboard", "false", "--train.device", "cpu", "--train.warmup_steps", "1",
                 "--quiet"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/chatcore/centered_acc" in r]
    assert len(evals) == 2 and all("eval/mc/acc" in r and "eval/mc/acc_norm" not in r for r in evals)
    assert all("eval/gen/exact_match" in r for r in evals)
    assert (run / "checkpoints" / "best").is_file()


def test_bad_input_is_one_line(trained_run, chat_run, tasks, tmp_path, capsys):
    # A pretraining run has no chat template: the message names the option that gives one.
    assert main(["evaluate", str(trained_run), "--tasks", str(tasks["mc"]), "--chat",
                 "--out", str(tmp_path / "x.json")]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no chat template" in err and "--chat-template default" in err
    # ... and --chat-template default scores it with the built-in format.
    assert main(["evaluate", str(trained_run), "--tasks", str(tasks["mc"]), "--chat", "--chat-template", "default",
                 "--out", str(tmp_path / "x.json"), "--quiet"]) == 0
    capsys.readouterr()
    bad = tmp_path / "noanswer.jsonl"
    bad.write_text(json.dumps({"prompt": "What is 2 plus 2?"}) + "\n")
    assert main(["evaluate", str(chat_run), "--tasks", str(bad), "--chat"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "line 1" in err and "'answer'" in err
    assert main(["evaluate", str(chat_run), "--tasks", str(tasks["gen"]), "--num-samples", "2"]) == 2  # USAGE_EXIT
    assert "--chat" in capsys.readouterr().err
    assert main(["evaluate", str(chat_run), "--tasks", str(tasks["gen"]), "--chat", "--num-samples", "2",
                 "--temperature", "0", "--out", str(tmp_path / "y.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--temperature" in err


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def test_every_task_format_is_asked_as_a_plain_question(tmp_path):
    from gptforge.eval.chat import CLOZE_INSTRUCTION, gold_reply, replies

    def last(task, index=0, shots=0):
        return chat_messages(task, index, shots, seed=0)[-1]["content"]

    arc = load_task(_jsonl(tmp_path / "arc.jsonl", [{"id": "q1", "question": {"stem": "Which is a gas?", "choices": [
        {"text": "ice", "label": "A"}, {"text": "steam", "label": "B"}]}, "answerKey": "B"}]))
    assert last(arc) == f"Which is a gas?\n\nA. ice\nB. steam\n\n{MC_INSTRUCTION}"  # no "Question: ...\nAnswer:"
    assert replies(arc, arc.examples[0]) == ["A", "B"] and gold_reply(arc, arc.examples[0]) == "B"

    (tmp_path / "data" / "test").mkdir(parents=True)
    (tmp_path / "data" / "dev").mkdir()
    (tmp_path / "data" / "test" / "high_school_math_test.csv").write_text('"What is 1+1?",1,2,3,4,B\n')
    (tmp_path / "data" / "dev" / "high_school_math_dev.csv").write_text("What is 2+2?,3,4,5,6,B\nWhat is 0?,0,1,2,3,A\n")
    mmlu = load_task(tmp_path / "data" / "test" / "high_school_math_test.csv")
    messages = chat_messages(mmlu, 0, 2, seed=0)
    # MMLU's dev questions (first two, in order) as answered turns; the subject line opens the first.
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[0]["content"] == ("The following are multiple choice questions (with answers) about high school "
                                      f"math.\n\nWhat is 2+2?\n\nA. 3\nB. 4\nC. 5\nD. 6\n\n{MC_INSTRUCTION}")
    assert [messages[1]["content"], messages[3]["content"]] == ["B", "A"]
    assert messages[4]["content"] == f"What is 1+1?\n\nA. 1\nB. 2\nC. 3\nD. 4\n\n{MC_INSTRUCTION}"

    hs = load_task(_jsonl(tmp_path / "hs.jsonl", [{
        "ind": 4, "activity_label": "Removing ice from car", "ctx_a": "Then, the man writes over the snow.",
        "ctx_b": "then", "endings": [", the man [title] adds wax.", " leaves.", " waits.", " stops."], "label": "3"}]))
    assert last(hs) == ("Removing ice from car: Then, the man writes over the snow. Then\n\n"
                        f"A. , the man. adds wax.\nB. leaves.\nC. waits.\nD. stops.\n\n{MC_INSTRUCTION}")
    piqa = load_task(_jsonl(tmp_path / "piqa.jsonl", [{"goal": "Open a jar", "sol1": "twist", "sol2": "lick",
                                                       "label": 0}]))
    assert last(piqa) == f"Open a jar\n\nA. twist\nB. lick\n\n{MC_INSTRUCTION}"
    wino = load_task(_jsonl(tmp_path / "w.jsonl", [{"sentence": "Sam gave Tom a book because _ was kind.",
                                                    "option1": "Sam", "option2": "Tom", "answer": "2"}]))
    assert last(wino) == f"Sam gave Tom a book because _ was kind.\n\nA. Sam\nB. Tom\n\n{MC_INSTRUCTION}"
    assert gold_reply(wino, wino.examples[0]) == "B"

    _jsonl(tmp_path / "rev.jsonl", [{"text": "import os", "label": "code"}, {"text": "Hello there", "label": "prose"}])
    (tmp_path / "rev.yaml").write_text("data: rev.jsonl\nlabels: {code: python, prose: english}\n")
    cls = load_task(tmp_path / "rev.yaml")
    assert last(cls, 1) == "Hello there\n\nAnswer with one of: python, english."  # the label words
    assert replies(cls, cls.examples[1]) == ["python", "english"] and gold_reply(cls, cls.examples[1]) == "english"

    cloze = load_task(_jsonl(tmp_path / "lambada.jsonl", [{"text": "for i in range(10)"}, {"text": "return self"}]))
    assert last(cloze, 1) == f"{CLOZE_INSTRUCTION}\n\nreturn" and replies(cloze, cloze.examples[1]) == ["self"]

    gen = load_task(_jsonl(tmp_path / "gen.jsonl", [{"prompt": "Capital of France?", "answer": ["Paris", "paris"]},
                                                    {"prompt": "2 + 2?", "answer": "4"}]))
    assert chat_messages(gen, 1, 1, seed=0) == [{"role": "user", "content": "Capital of France?"},
                                                {"role": "assistant", "content": "Paris"},
                                                {"role": "user", "content": "2 + 2?"}]


def test_label_words_are_scored_as_the_reply(chat_run, tmp_path):
    rows = [{"text": t, "label": lab} for t, lab in [("import os", "code"), ("Hello there", "prose"),
                                                   ("def f(x):", "code"), ("Good morning", "prose")]]
    _jsonl(tmp_path / "kind.jsonl", rows)
    (tmp_path / "kind.yaml").write_text("data: kind.jsonl\nlabels: {code: python, prose: english}\n")
    out = tmp_path / "k.json"
    assert main(["evaluate", str(chat_run), "--tasks", str(tmp_path / "kind.yaml"), "--chat", "--out", str(out),
                 "--quiet"]) == 0
    rec = json.loads(out.read_text())["tasks"]["kind"]
    preds = json.loads(out.with_name("k.predictions.json").read_text())["kind"]
    assert rec["chat"] is True and "macro_f1" in rec["metrics"] and rec["confusion_matrix"]
    from gptforge.runtime.loading import load_for_inference

    model, _, _, _ = load_for_inference(chat_run, "cpu")
    fmt = load_chat_format(str(chat_run), chat_run / "tokenizer.json")
    task = load_task(tmp_path / "kind.yaml")
    for i, p in enumerate(preds):
        ctx = fmt.prompt_ids(chat_messages(task, i))
        want = [_direct_loglikelihood(model, ctx, fmt.reply_ids(w)) for w in ("python", "english")]
        assert p["loglikelihoods"] == pytest.approx(want, abs=1e-3) and p["pred"] == int(np.argmax(want))
    acc = np.mean([p["pred"] == e.label for p, e in zip(preds, task.examples, strict=True)])
    assert rec["metrics"]["acc"]["value"] == pytest.approx(acc)


def test_gsm8k_plain_scoring_checks_the_final_answer(loaded, tasks, tmp_path):
    from gptforge.eval.answers import answers_match, extract_answer
    from gptforge.eval.runner import _generation_metrics, run_task

    (tmp_path / "gsm8k.jsonl").write_text(tasks["gsm8k"].read_text())
    (tmp_path / "gsm.yaml").write_text("data: gsm8k.jsonl\nmax_new_tokens: 8\n")
    model, tok = loaded
    task = load_task(tmp_path / "gsm.yaml")
    assert task.format == "gsm8k" and task.stop == ["Question:"] and task.max_new_tokens == 8
    assert task.examples[0].contexts == [f"Question: {GSM8K[0]['question']}\nAnswer:"]
    r = run_task(model, tok, task)
    assert set(r.metrics) == {"exact_match"} and len(r.predictions) == 3
    want = np.mean([answers_match(extract_answer(p["output"]), e.answers[0])
                    for p, e in zip(r.predictions, task.examples, strict=True)])
    assert r.metrics["exact_match"]["value"] == pytest.approx(want)
    # A worked solution is right when its final answer is: 1,000 = 1000; 31 is not 30.
    outputs = [{"output": " so 7 apples.\n#### 7"}, {"output": " 1000 pens are left. #### 1000"},
               {"output": " 5 * 6 = 31"}]
    assert _generation_metrics(task, task.examples, outputs)["exact_match"]["value"] == pytest.approx(2 / 3)


def test_in_loop_chat_scoring_needs_tasks_and_a_template(tiny_shards, tasks, tmp_path):
    from gptforge.errors import InputError
    from tests.conftest import train_nano_run

    with pytest.raises(InputError, match="train.eval_chat true needs train.eval_tasks"):
        train_nano_run(tiny_shards, tmp_path / "a", max_steps=2, warmup_steps=1, eval_chat=True)
    # A pretraining run has no chat template: the message names finetune.chat_template.
    with pytest.raises(InputError, match=r"has no chat template.*finetune\.chat_template"):
        train_nano_run(tiny_shards, tmp_path / "b", max_steps=2, warmup_steps=1, eval_interval=1, eval_tasks=[str(tasks["mc"])],
                       eval_chat=True)
