"""Score tasks (see `gptforge.eval.tasks`) with a model: few-shot contexts, requests, metrics.

`evaluate_tasks(model, tokenizer, tasks, device, precision, batch_size)` is the call for a
training loop: {task name: {metric: value}}. `run_task` returns everything (`TaskResult`: values,
stderrs, n, truncation count, confusion matrix, speed), which `gptforge evaluate` writes to
results.json.

Few-shot examples: `num_fewshot` demonstrations (each example solved: context, delimiter, gold
answer) joined by "\\n\\n" before the context, after the task's description. They are drawn
without replacement from the task's few-shot file when it has one (`fewshot_data`, MMLU's dev
file), else from the task's other rows (never the example itself), by `random.Random` seeded with
`"{seed}-{row index}"`: the same examples whatever --limit, batch size or device. MMLU's dev file
gives its first k questions in order, as lm-evaluation-harness's `first_n` sampler.

Metrics per type (lm-evaluation-harness 0.4's definitions where it has them):
- multiple_choice: `acc` (argmax of the log-likelihoods is the gold choice) and `acc_norm`
  (argmax of log-likelihood / len(choice) in characters); WinoGrande reports `acc` only (all of an
  example's continuations are the same text).
- classification: `acc`, per-class precision / recall / F1, macro and micro F1, confusion matrix
  (`gptforge.eval.metrics.classification_report`), prediction = most likely verbalizer.
- generation: greedy decoding until a stop string, the end-of-text token or max_new_tokens;
  `exact_match` and `f1` after SQuAD normalisation, best over the reference answers.
- perplexity (`{"text"}` rows): lm-eval's rolling log-likelihood (disjoint windows of block_size
  tokens, the end-of-text token before the text) and its `word_perplexity`, `byte_perplexity` and
  `bits_per_byte` (totals over the documents); stderr by the delta method for a ratio of sums
  (Cochran 1977, Sampling Techniques, sec. 6.3: se(R) = sqrt(sum((x_i - R y_i)^2) / (n (n - 1))) / mean(y)).
- cloze: `acc` (the last word is the greedy continuation, token by token, as lm-eval's LAMBADA) and
  `perplexity` = exp(-mean log-likelihood of the word), stderr by the delta method
  (perplexity * stderr of the mean log-likelihood).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from gptforge.errors import InputError
from gptforge.eval.metrics import (
    centered_aggregate,
    exact_match,
    mean_metric,
    metric,
    token_f1,
)
from gptforge.eval.scoring import encode_pair, make_units, score_units
from gptforge.eval.task_result import TaskResult, choice_metrics, fewshot_picks, generation_metrics
from gptforge.eval.tasks import Task, load_task
from gptforge.progress import progress as show_progress

if TYPE_CHECKING:
    from gptforge.model.gpt import GPT

DEFAULT_SEED = 1234
"""Few-shot seed (lm-evaluation-harness's default fewshot_random_seed)."""


def fewshot_contexts(task: Task, index: int, num_fewshot: int, seed: int) -> list[str]:
    """The contexts of `task.examples[index]` with its few-shot prefix (see the module doc).

    Raises:
        InputError: fewer candidate examples than num_fewshot.
    """
    prefix = task.description + "".join(d.demo + task.fewshot_delimiter
                                        for d in fewshot_picks(task, index, num_fewshot, seed))
    return [prefix + c for c in task.examples[index].contexts]


def _generate(model, tokenizer, prompts: list[list[int]], max_new_tokens: int, stop: list[str], batch_size: int,
              device: torch.device, precision: str, bar=None) -> list[str]:
    """Greedy continuations of token prompts, cut before the first stop string or end-of-text.
    Prompts are batched by length (`gptforge.infer.generate.generate_batch`, left-padded); a row
    stops at its stop string, the batch when every row has."""
    from gptforge.infer.generate import generate_batch
    from gptforge.runtime.device import autocast_context

    outputs: list[str] = [""] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    for b in range(0, len(order), batch_size):
        rows = order[b:b + batch_size]
        with autocast_context(device, precision):
            gens = generate_batch(model, [prompts[i] for i in rows], max_new_tokens, temperature=0.0,
                                  eos_id=tokenizer.eos_id, stop=stop, decode=tokenizer.decode)
        for i, g in zip(rows, gens, strict=True):
            outputs[i] = g.text
        if bar is not None:
            bar.advance(len(rows))
    return outputs


def _ratio_se(x: np.ndarray, y: np.ndarray) -> float:
    n = len(x)
    if n < 2:
        return 0.0
    r = x.sum() / y.sum()
    return float(math.sqrt(((x - r * y) ** 2).sum() / (n * (n - 1))) / y.mean())


def perplexity_metrics(nats: Sequence[float], n_bytes: Sequence[int], words: Sequence[int]) -> dict[str, dict]:
    """word_perplexity, byte_perplexity, bits_per_byte of documents with total negative
    log-likelihoods `nats`, UTF-8 byte and whitespace-word counts (see the module doc)."""
    x, b, w = (np.asarray(v, dtype=np.float64) for v in (nats, n_bytes, words))
    n = len(x)
    per_byte, per_word = x.sum() / b.sum(), x.sum() / w.sum()
    se_b, se_w = _ratio_se(x, b), _ratio_se(x, w)
    return {"word_perplexity": metric(math.exp(per_word), math.exp(per_word) * se_w, n),
            "byte_perplexity": metric(math.exp(per_byte), math.exp(per_byte) * se_b, n),
            "bits_per_byte": metric(per_byte / math.log(2), se_b / math.log(2), n)}


def run_task(model: GPT, tokenizer, task: Task | str | Path, device: torch.device | str = "cpu",
             precision: str = "fp32", batch_size: int = 32, num_fewshot: int = 0, limit: int | None = None,
             seed: int = DEFAULT_SEED, padding_side: str = "right", progress: bool = False,
             chat=None, num_samples: int = 1, temperature: float = 0.0) -> TaskResult:
    """Score one task (its first `limit` examples; a larger limit is the whole task).

    tokenizer: a `gptforge.data.tokenizer.Tokenizer` (encode, decode, eos_id).
    chat: a `gptforge.eval.chat.ChatFormat` to score through the chat template
        (`gptforge.eval.chat_runner`; perplexity tasks stay plain), with `num_samples` replies per
        generation example at `temperature`; None scores plain text.

    Raises:
        InputError: bad task file (see `load_task`), too few few-shot candidates, a continuation
            longer than the model's context, generation longer than the context.
    """
    if isinstance(task, (str, Path)):
        task = load_task(task)
    n = len(task.examples) if limit is None else min(limit, len(task.examples))
    if chat is not None and task.type != "perplexity":
        from gptforge.eval.chat_runner import ChatRun, run_chat_task

        return run_chat_task(ChatRun(model, chat, task, n, torch.device(device), precision, batch_size, num_fewshot,
                                     seed, num_samples, temperature, progress))
    t0 = time.perf_counter()
    run = _TaskRun(model=model, tokenizer=tokenizer, task=task, examples=task.examples[:n],
                   contexts=[fewshot_contexts(task, i, num_fewshot, seed) for i in range(n)],
                   device=torch.device(device), precision=precision, batch_size=batch_size, progress=progress)
    common: dict[str, Any] = dict(name=task.name, type=task.type, format=task.format, path=str(task.path), sha256=task.sha256, n=n,
                  num_fewshot=num_fewshot, seed=seed)
    scorer = {"perplexity": _score_perplexity, "generation": _score_generation}.get(task.type)
    if scorer is not None:
        fields = scorer(run)
    else:
        fields = _score_choices(run, padding_side)
    return TaskResult(**common, **fields, seconds=time.perf_counter() - t0)


@dataclass
class _TaskRun:
    """What every scorer of `run_task` reads: the model, the examples and their few-shot contexts."""

    model: GPT
    tokenizer: Any
    task: Task
    examples: list
    contexts: list
    device: torch.device
    precision: str
    batch_size: int
    progress: bool

    @property
    def block(self) -> int:
        return self.model.config.block_size

    def bar(self, total: int, unit: str):
        return show_progress(f"scoring {self.task.name}", total, unit, enabled=self.progress)


def _score_perplexity(run: _TaskRun) -> dict:
    """Rolling log-likelihood of each `{"text"}` row (disjoint windows, EOS first), lm-eval's way."""
    from gptforge.eval.perplexity import evaluate_tokens
    from gptforge.runtime.device import AUTOCAST_DTYPES

    tok = run.tokenizer
    preds = []
    with run.bar(len(run.examples), "documents") as bar:
        for e in run.examples:
            toks = np.array([tok.eos_id] + tok.encode(e.answers[0]), dtype=np.int64)
            r = evaluate_tokens(run.model, toks, stride=run.block, batch_size=run.batch_size, device=run.device,
                                autocast_dtype=AUTOCAST_DTYPES.get(run.precision))
            preds.append({"line": e.line, "nats": r.total_nats, "tokens": r.tokens,
                          "bytes": len(e.answers[0].encode("utf-8")), "words": len(re.split(r"\s+", e.answers[0]))})
            bar.advance()
    metrics = perplexity_metrics([p["nats"] for p in preds], [p["bytes"] for p in preds], [p["words"] for p in preds])
    return dict(truncated=0, metrics=metrics, predictions=preds)


def _score_generation(run: _TaskRun) -> dict:
    """Greedy generation per example, scored by exact match and token F1 (SQuAD normalisation)."""
    task, tok, model = run.task, run.tokenizer, run.model
    if task.max_new_tokens >= run.block:
        raise InputError(f"{task.path}: max_new_tokens {task.max_new_tokens} leaves no room for the prompt in "
                         f"the model's context of {run.block} tokens")
    keep = run.block - task.max_new_tokens
    prompts = [tok.encode(c[0]) or [tok.eos_id] for c in run.contexts]
    truncated = sum(len(p) > keep for p in prompts)
    prompts = [p[-keep:] for p in prompts]
    was_training = model.training
    model.eval()
    try:
        with run.bar(len(run.examples), "examples") as bar:
            outs = _generate(model, tok, prompts, task.max_new_tokens, task.stop, run.batch_size, run.device,
                             run.precision, bar)
    finally:
        model.train(was_training)
    preds = [{"line": e.line, "output": o} for e, o in zip(run.examples, outs, strict=True)]
    return dict(truncated=truncated, metrics=_generation_metrics(task, run.examples, preds), predictions=preds)


def _generation_metrics(task: Task, examples, preds: list[dict]) -> dict[str, dict]:
    """Plain generation: exact match and token F1 after SQuAD normalisation; GSM8K: exact match of
    the extracted final answer (`gptforge.eval.answers`)."""
    if task.format == "gsm8k":
        from gptforge.eval.answers import answers_match, extract_answer

        return {"exact_match": mean_metric([float(any(answers_match(extract_answer(p["output"]), a) for a in e.answers))
                                            for p, e in zip(preds, examples, strict=True)])}
    return {"exact_match": mean_metric([exact_match(p["output"], e.answers) for p, e in zip(preds, examples, strict=True)]),
            "f1": mean_metric([token_f1(p["output"], e.answers) for p, e in zip(preds, examples, strict=True)])}


def _score_choices(run: _TaskRun, padding_side: str) -> dict:
    """Log-likelihood of every (context, continuation) request; multiple choice, classification
    and cloze metrics from them (`_choice_metrics`)."""
    task, tok, examples, block = run.task, run.tokenizer, run.examples, run.block
    requests, owner = [], []
    for k, (ex, ctxs) in enumerate(zip(examples, run.contexts, strict=True)):
        for j, cont in enumerate(ex.continuations):
            requests.append((ctxs[j] if len(ctxs) > 1 else ctxs[0], cont))
            owner.append(k)
    cache: dict[str, list[int]] = {}

    def encode(s: str) -> list[int]:
        if s not in cache:
            cache[s] = tok.encode(s)
        return cache[s]

    pairs = [encode_pair(encode, c, x, tok.eos_id) for c, x in requests]
    for (_, cont), (_, text), k in zip(pairs, requests, owner, strict=True):
        if not cont or len(cont) > block:
            why = "encodes to no tokens after the context" if not cont else \
                f"is {len(cont)} tokens, longer than the model's context of {block}"
            raise InputError(f"{task.path}, line {examples[k].line}: the continuation {text!r} {why}")
    units, truncated = make_units(pairs, block)
    with run.bar(len(units), "requests") as bar:
        ll, greedy = score_units(run.model, units, len(requests), run.batch_size, run.device, run.precision,
                                 padding_side, on_batch=bar.advance)
    lls: list[list[float]] = [[] for _ in examples]
    grs: list[list[bool]] = [[] for _ in examples]
    for r, k in enumerate(owner):
        lls[k].append(ll[r])
        grs[k].append(greedy[r])
    metrics, confusion, preds = choice_metrics(task, examples, lls, grs)
    for p, x in zip(preds, lls, strict=True):
        p["loglikelihoods"] = x
    return dict(truncated=truncated, metrics=metrics, confusion_matrix=confusion, chance=task.chance,
                predictions=preds)


def subset_metrics(task: Task, result: TaskResult, keep: list[int]) -> dict[str, dict]:
    """`result`'s metrics recomputed over the examples `keep` (indices into the scored examples),
    from its stored predictions (e.g. the examples a contamination check found clean); {} if none."""
    if not keep:
        return {}
    examples = [task.examples[i] for i in keep]
    preds = [result.predictions[i] for i in keep]
    if task.type == "perplexity":
        return perplexity_metrics([p["nats"] for p in preds], [p["bytes"] for p in preds], [p["words"] for p in preds])
    if task.type == "generation" and result.chat:
        return generation_metrics(preds, len(preds[0].get("outputs", [None])))
    if task.type == "generation":
        return _generation_metrics(task, examples, preds)
    lls = [p["loglikelihoods"] for p in preds]
    greedy = [[bool(p["pred"])] for p in preds]  # read only for cloze, where pred is the greedy flag
    out = choice_metrics(task, examples, lls, greedy)[0]
    if result.chat:
        out.pop("acc_norm", None)
    return out


def main_metric(result: TaskResult) -> str:
    """The metric CORE and tables lead with: exact_match for generation, else acc."""
    return "exact_match" if result.type == "generation" else "acc"


def aggregate(results: list[TaskResult]) -> dict | None:
    """{"core": metric record} over the tasks scored plain and {"chatcore": ...} over those scored
    through the chat template: each task's main metric rescaled so chance is 0 and a perfect score
    1, averaged (DCLM's centred accuracy, see metrics; nanochat's ChatCORE). Perplexity tasks have
    no accuracy and are left out. None without such tasks."""
    out = {}
    for key, chat in (("core", False), ("chatcore", True)):
        scored = [r for r in results if r.type != "perplexity" and r.chat == chat]
        if scored:
            out[key] = centered_aggregate({r.name: (r.metrics[main_metric(r)], r.chance) for r in scored})
    return out or None


def evaluate_tasks(model: GPT, tokenizer, tasks: Sequence[Task | str | Path], device: torch.device | str = "cpu",
                   precision: str = "fp32", batch_size: int = 32, num_fewshot: int = 0, limit: int | None = None,
                   seed: int = DEFAULT_SEED, chat=None) -> dict[str, dict[str, float]]:
    """Score `tasks` and return {task name: {metric: value}}, plus "core" (plain) or "chatcore"
    (`chat`, a `gptforge.eval.chat.ChatFormat`: through the chat template) {"centered_acc": v}
    when several tasks.

    The call for a trainer's periodic evaluation: pass loaded `Task`s to read the files once. The
    model is left in the train/eval mode it came in. Log each value as `eval/<task>/<metric>`.
    """
    results = [run_task(model, tokenizer, t, device, precision, batch_size, num_fewshot, limit, seed, chat=chat)
               for t in tasks]
    out = {r.name: {m: rec["value"] for m, rec in r.metrics.items()} for r in results}
    agg = aggregate(results) if len(results) > 1 else None
    for key, rec in (agg or {}).items():
        out[key] = {"centered_acc": rec["value"]}
    return out


def higher_is_better(metric_name: str) -> bool:
    """Direction of a metric named by `evaluate_tasks` / `log_items` ("acc", "eval/t/f1/pos", ...):
    False for perplexities and bits per byte, True for accuracies, F1, exact match, CORE. For a
    trainer's best-checkpoint choice by a task metric (`train.best_metric`)."""
    last = metric_name.split("/")[-1]
    if metric_name.split("/")[-2:-1] in (["precision"], ["recall"], ["f1"]):
        return True
    return not (last.endswith("perplexity") or last == "bits_per_byte")


def log_items(scores: dict[str, dict[str, float]], prefix: str = "eval") -> dict[str, float]:
    """`evaluate_tasks`'s output as flat metric names for metrics.jsonl / TensorBoard:
    {"eval/<task>/<metric>": value} (per-class names keep their slash: eval/t/f1/pos)."""
    return {f"{prefix}/{task}/{m}": v for task, ms in scores.items() for m, v in ms.items()}


def format_table(results: list[TaskResult], agg: dict | None = None) -> str:
    """A plain-text table: task, metric, value ± stderr, n, k-shot, truncated, examples/s."""
    rows = [("task", "metric", "value", "stderr", "n", "shots", "truncated", "ex/s")]
    for r in results:
        for i, (name, rec) in enumerate(r.metrics.items()):
            if "/" in name:  # per-class figures are in results.json
                continue
            rows.append(((r.name + (" (chat)" if r.chat else "")) if i == 0 else "", name, f"{rec['value']:.4f}",
                         "" if rec["stderr"] is None else f"{rec['stderr']:.4f}", str(rec["n"]),
                         str(r.num_fewshot) if i == 0 else "", str(r.truncated) if i == 0 else "",
                         f"{r.examples_per_s:.1f}" if i == 0 else ""))
    for key, label in (("core", "CORE"), ("chatcore", "ChatCORE")):
        c = (agg or {}).get(key)
        if c:
            rows.append((label, "centered_acc", f"{c['value']:.4f}", f"{c['stderr']:.4f}", str(c["n"]), "", "", ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)
