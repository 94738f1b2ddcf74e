"""Score tasks through the chat template (`gptforge evaluate --chat`); rendering is `gptforge.eval.chat`.

- multiple choice: `acc`, argmax of the answer letters' log-likelihoods after the assistant
  header (one packed forward per example, `gptforge.eval.scoring`); the log-likelihoods go to
  results.predictions.json. Chance is 1 / number of options.
- classification: `acc`, per-class and macro/micro F1 (`gptforge.eval.metrics.classification_report`)
  over the label words' log-likelihoods as the reply.
- cloze: `acc` (the word is the greedy reply) and `perplexity` of the word.
- generation: `num_samples` replies per example, greedy when temperature is 0, else sampled
  (`gptforge.infer.generate.generate_batch`, batched with a KV cache, seeded per batch: the
  same samples for the same seed and batch size), each stopped at the template's end-of-turn
  token or the task's max_new_tokens; a reply is correct when its extracted final answer
  (`gptforge.eval.answers.reply_answer`: `extract_answer`, or a one-line reply as a whole) matches
  a reference answer (`answers_match`).
  `exact_match` is the mean fraction of correct replies per example (with one sample: the
  accuracy); with several samples, `pass@k` for k = 1, 2, 4, ... and num_samples (the unbiased
  estimator of Chen et al. 2021, `gptforge.eval.metrics.pass_at_k`). Chance is 0.
- perplexity tasks are documents and are scored plain (`chat: false` in their result).

`chatcore` (`gptforge.eval.runner.aggregate`) averages each task's main metric rescaled so that
chance is 0 and a perfect score 1 (nanochat's ChatCORE; DCLM's centring).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from gptforge.errors import InputError, OptionError
from gptforge.eval.chat import ChatFormat, chat_messages, replies
from gptforge.eval.task_result import TaskResult, choice_metrics, generation_metrics
from gptforge.progress import progress as show_progress


@dataclass
class ChatRun:
    """One task's chat scoring: the model, the chat format and the sampling settings."""

    model: Any
    chat: ChatFormat
    task: Any
    n: int
    device: torch.device
    precision: str
    batch_size: int
    num_fewshot: int
    seed: int
    num_samples: int = 1
    temperature: float = 0.0
    progress: bool = False

    def prompts(self) -> list[list[int]]:
        """Token ids of each example's conversation up to the assistant header."""
        return [self.chat.prompt_ids(chat_messages(self.task, i, self.num_fewshot, self.seed)) for i in range(self.n)]

    def bar(self, total: int, unit: str):
        return show_progress(f"scoring {self.task.name} (chat)", total, unit, enabled=self.progress)


def run_chat_task(run: ChatRun):
    """Score `run.task`'s first `run.n` examples through the chat template.

    Returns: a `gptforge.eval.task_result.TaskResult` with `chat` True.

    Raises:
        InputError: a perplexity task; more than 26 options; generation whose max_new_tokens fills the context;
            num_samples > 1 with temperature 0; too few few-shot candidates.
    """
    task = run.task
    if task.type == "perplexity":
        raise InputError(f"{task.path}: a perplexity task scores documents, not replies; score it without --chat")
    t0 = time.perf_counter()
    fields = _score_generation(run) if task.type == "generation" else _score_replies(run)
    return TaskResult(name=task.name, type=task.type, format=task.format, path=str(task.path), sha256=task.sha256,
                      n=run.n, num_fewshot=run.num_fewshot, seed=run.seed, seconds=time.perf_counter() - t0,
                      chat=True, **fields)


def _score_replies(run: ChatRun) -> dict:
    """Log-likelihood of each candidate reply after the assistant header (letters, label words, the word)."""
    from gptforge.eval.scoring import make_units, score_units

    task, examples = run.task, run.task.examples[:run.n]
    block = run.model.config.block_size
    pairs, owner = [], []
    for k, (ex, ctx) in enumerate(zip(examples, run.prompts(), strict=True)):
        for text in replies(task, ex):
            cont = run.chat.reply_ids(text)
            if not cont or len(cont) > block:
                raise InputError(f"{task.path}, line {ex.line}: the reply {text!r} is {len(cont)} tokens; it must "
                                 f"be 1 to {block} (the model's context)")
            pairs.append((ctx, cont))
            owner.append(k)
    units, truncated = make_units(pairs, block)
    with run.bar(len(units), "forward rows") as bar:
        ll, greedy = score_units(run.model, units, len(pairs), run.batch_size, run.device, run.precision,
                                 on_batch=bar.advance)
    lls: list[list[float]] = [[] for _ in examples]
    grs: list[list[bool]] = [[] for _ in examples]
    for r, k in enumerate(owner):
        lls[k].append(ll[r])
        grs[k].append(greedy[r])
    metrics, confusion, preds = choice_metrics(task, examples, lls, grs)
    metrics.pop("acc_norm", None)  # every letter is one character: acc_norm would repeat acc
    for p, x in zip(preds, lls, strict=True):
        p["loglikelihoods"] = x
    return dict(truncated=truncated, metrics=metrics, confusion_matrix=confusion, chance=task.chance,
                predictions=preds)


def _score_generation(run: ChatRun) -> dict:
    """`num_samples` replies per example, their final answers extracted and checked."""
    from gptforge.eval.answers import answers_match, reply_answer
    from gptforge.infer.generate import generate_batch
    from gptforge.runtime.device import autocast_context

    task, k = run.task, run.num_samples
    block = run.model.config.block_size
    if k > 1 and run.temperature <= 0:
        raise OptionError(f"--num-samples {k} with --temperature 0 gives {k} identical greedy replies; give "
                         "--temperature above 0 (e.g. 0.8)")
    if task.max_new_tokens >= block:
        raise InputError(f"{task.path}: max_new_tokens {task.max_new_tokens} leaves no room for the prompt in the "
                         f"model's context of {block} tokens; set max_new_tokens in a YAML task definition")
    keep = block - task.max_new_tokens
    prompts = run.prompts()
    truncated = sum(len(p) > keep for p in prompts)
    rows = [(i, p[-keep:]) for i, p in enumerate(prompts) for _ in range(k)]
    rows.sort(key=lambda r: -len(r[1]))
    end_id = run.chat.end_of_turn_id()
    outputs: list[list[str]] = [[] for _ in prompts]
    with run.bar(len(rows), "replies") as bar:
        for b in range(0, len(rows), run.batch_size):
            chunk = rows[b:b + run.batch_size]
            with autocast_context(run.device, run.precision):
                gens = generate_batch(run.model, [p for _, p in chunk], task.max_new_tokens,
                                      temperature=run.temperature, seed=run.seed + b, eos_id=end_id)
            for (i, _), g in zip(chunk, gens, strict=True):
                outputs[i].append(run.chat.decode([t for t in g.tokens if t != end_id]))
            bar.advance(len(chunk))
    preds = []
    for ex, outs in zip(task.examples[:run.n], outputs, strict=True):
        found = [reply_answer(o) for o in outs]
        correct = sum(any(answers_match(a, ref) for ref in ex.answers) for a in found)
        pred: dict[str, Any] = {"line": ex.line, "correct": correct}
        if k == 1:
            pred.update(output=outs[0], answer=found[0])
        else:
            pred.update(outputs=outs, answers=found)
        preds.append(pred)
    return dict(truncated=truncated, metrics=generation_metrics(preds, k), predictions=preds)
