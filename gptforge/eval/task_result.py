"""What scoring a task yields, shared by the plain scorer (`gptforge.eval.runner`) and the chat
scorer (`gptforge.eval.chat_runner`): the `TaskResult`, the few-shot draw, and metrics computed
from per-example predictions (choice log-likelihoods; correct counts of sampled replies).

Few-shot draw (`fewshot_picks`): without replacement from the task's few-shot file when it has one
(`fewshot_data`, MMLU's dev file), else from the task's other rows (never the example itself), by
`random.Random` seeded with `"{seed}-{row index}"`; MMLU's dev file gives its first k questions in
order, as lm-evaluation-harness's `first_n` sampler.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import numpy as np

from gptforge.errors import InputError
from gptforge.eval.metrics import classification_report, mean_metric, mean_stderr, metric, pass_at_k
from gptforge.eval.tasks import Task


@dataclass
class TaskResult:
    """The outcome of one task: `metrics` maps a name to {"value", "stderr", "n"}."""

    name: str
    type: str
    format: str
    path: str
    sha256: str
    n: int
    num_fewshot: int
    seed: int
    truncated: int
    """Requests (or generation prompts) whose context was cut from the left to fit block_size."""
    metrics: dict[str, dict]
    seconds: float
    confusion_matrix: dict | None = None
    chance: float = 0.0
    predictions: list = field(default_factory=list)
    """Per example: {"line", and "pred" (choice index) or "output" (generated text)}."""
    clean: dict | None = None
    """{"n", "metrics"} over the examples a contamination check found clean (set by the caller)."""
    chat: bool = False
    """Scored through the model's chat template (`gptforge.eval.chat_runner`)."""

    @property
    def examples_per_s(self) -> float:
        return self.n / self.seconds if self.seconds > 0 else float("inf")

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("name", "type", "format", "path", "sha256", "n", "num_fewshot", "seed",
                                            "truncated", "metrics", "chance", "seconds", "chat")}
        d["examples_per_s"] = self.examples_per_s
        if self.confusion_matrix is not None:
            d["confusion_matrix"] = self.confusion_matrix
        if self.clean is not None:
            d["clean"] = self.clean
        return d


def fewshot_picks(task: Task, index: int, num_fewshot: int, seed: int) -> list:
    """The few-shot demonstration Examples of `task.examples[index]`, in order (see the module doc).

    Raises:
        InputError: fewer candidate examples than num_fewshot.
    """
    if num_fewshot <= 0:
        return []
    pool = task.fewshot_pool if task.fewshot_pool is not None else task.examples
    candidates = len(pool) - (0 if task.fewshot_pool is not None else 1)
    if candidates < num_fewshot:
        raise InputError(f"{task.path}: --num-fewshot {num_fewshot} but the task has only {candidates} "
                         "few-shot candidates; lower --num-fewshot or give it a fewshot_data file")
    rng = random.Random(f"{seed}-{index}")
    if task.fewshot_sampler == "first_n" and task.fewshot_pool is not None:
        picks = list(range(num_fewshot))
    elif task.fewshot_pool is not None:
        picks = rng.sample(range(len(pool)), num_fewshot)
    else:
        picks = [i for i in rng.sample(range(len(pool)), num_fewshot + 1) if i != index][:num_fewshot]
    return [pool[i] for i in picks]


def choice_metrics(task: Task, examples, lls: list[list[float]], greedy: list[list[bool]]) -> tuple[dict, dict | None,
                                                                                                     list]:
    """(metrics, confusion matrix or None, predictions) of choice-based examples from each
    example's continuation log-likelihoods `lls` and greedy flags `greedy` (see `gptforge.eval.runner`)."""
    gold = [e.label for e in examples]
    pred = [int(np.argmax(x)) for x in lls]
    preds = [{"line": e.line, "pred": p} for e, p in zip(examples, pred, strict=True)]
    if task.type == "classification":
        rep = classification_report(gold, pred, task.labels)
        return rep["metrics"], rep["confusion_matrix"], preds
    if task.type == "cloze":
        acc = [float(g[0]) for g in greedy]
        word_ll = np.array([x[0] for x in lls])
        mean_ll = float(word_ll.mean())
        ppl = math.exp(-mean_ll)
        return {"acc": mean_metric(acc), "perplexity": metric(ppl, ppl * mean_stderr(word_ll), len(word_ll))}, None, \
            [{"line": e.line, "pred": int(g[0])} for e, g in zip(examples, greedy, strict=True)]
    out = {"acc": mean_metric([float(p == g) for p, g in zip(pred, gold, strict=True)])}
    if task.format != "winogrande":
        norm = [int(np.argmax(np.array(x) / np.array(e.choice_lengths, dtype=np.float64)))
                for x, e in zip(lls, examples, strict=True)]
        out["acc_norm"] = mean_metric([float(p == g) for p, g in zip(norm, gold, strict=True)])
    return out, None, preds


def sample_ks(num_samples: int) -> list[int]:
    """The k of the pass@k figures for `num_samples` replies: 1, 2, 4, ... below it, and itself."""
    ks, k = [], 1
    while k < num_samples:
        ks.append(k)
        k *= 2
    return ks + [num_samples]


def generation_metrics(predictions: list[dict], num_samples: int) -> dict[str, dict]:
    """`exact_match` (mean fraction of correct replies) and, with several samples, `pass@k`, from
    predictions carrying "correct" (the number of correct replies of each example)."""
    correct = [p["correct"] for p in predictions]
    out = {"exact_match": mean_metric([c / num_samples for c in correct])}
    if num_samples > 1:
        for k in sample_ks(num_samples):
            out[f"pass@{k}"] = mean_metric([pass_at_k(num_samples, c, k) for c in correct]) if correct else \
                metric(float("nan"), None, 0)
    return out
