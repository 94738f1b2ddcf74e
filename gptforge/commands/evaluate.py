"""`gptforge evaluate MODEL (--tasks T1 T2 ... | --harness TASK ... | --data DIR [--split val|test] | --text FILE)`."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Literal, Optional

from gptforge.options import bounded

# One description: `gptforge --help` lists SUMMARY (read from this file unimported); DESCRIPTION begins with it.
SUMMARY = "Benchmark tasks (acc, acc_norm, F1, exact match; lm-eval conventions), or loss/perplexity/bits per byte."

DESCRIPTION = SUMMARY + """

Score a run, checkpoint or Hugging Face folder on benchmark task files (--tasks:
multiple choice, classification, generation, cloze; acc / acc_norm / F1 / exact match with stderr
and n, lm-evaluation-harness's conventions; results.json in MODEL/eval/), or measure loss
(nats/token), perplexity and bits per byte over a split of a shard folder (--data) or a text file
(--text), with windows of block_size tokens sliding by --stride so every token is scored once.
Task formats: jsonl {context, choices, label}; HellaSwag, ARC and PIQA/WinoGrande jsonl; MMLU csv;
{text, label} classification; {prompt, answer} generation; {text} cloze (last word); or a YAML
task definition (data, type, prompt, labels, fewshot_data, ...; type: perplexity for documents).
--chat asks every task through the model's chat template (multiple choice as lettered options
scored by the answer letter; generation checked on the extracted final answer; ChatCORE)."""


@dataclass
class EvaluateOptions:
    model: str
    """Run directory (checkpoints/latest, or best with --best), checkpoint folder, or Hugging Face folder."""
    tasks: Optional[list[str]] = None
    """Task files (.jsonl, .csv, or .yaml task definitions) to score."""
    harness: Optional[list[str]] = None
    """lm-evaluation-harness task names, run by lm-eval's own task code on this model, offline (needs gptforge[eval])."""
    include_path: Optional[str] = None
    """Folder of lm-eval task YAML definitions for --harness (their data as local files)."""
    chat: bool = False
    """--tasks through the model's chat template: multiple choice as a question with lettered options
    scored by the answer letter, classification by the label words, generation by the final answer
    extracted from the reply; few-shot examples as earlier turns; ChatCORE over several tasks
    (default results file MODEL/eval/chat_results.json)."""
    chat_template: str = "auto"
    """With --chat: auto (the model's own template), default (gptforge's built-in instruction format),
    or the path of a Jinja chat template file."""
    num_samples: int = bounded(1, low=1)
    """With --chat: replies sampled per generation example; more than 1 reports pass@k (unbiased estimator)."""
    temperature: Optional[float] = bounded(None, low=0.0)
    """With --chat: sampling temperature of generation (default 0, greedy, for one sample; 1.0 for several)."""
    num_fewshot: int = bounded(0, low=0)
    """Few-shot demonstrations before each example (from the task's fewshot_data or its other rows)."""
    limit: Optional[int] = bounded(None, low=1)
    """Score only the first N examples of each task (a larger N is the whole task)."""
    seed: int = bounded(1234, low=0)
    """Seed of the few-shot draw."""
    out: Optional[str] = None
    """results.json path (default MODEL/eval/results.json; the run directory's eval/ for a checkpoint folder).
    With --text or --data: a JSON file for the measured loss, perplexity and bits per byte (written
    only when given)."""
    contamination: Optional[str] = None
    """Shard folder of the training data: flag examples sharing a token n-gram with its train split, and
    report every score on the clean examples too."""
    contamination_ngram: int = bounded(13, low=1)
    """n of the contamination n-grams (tokens of the data's tokenizer; GPT-3 appendix C used 13)."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Autocast precision of the forward passes (log-softmax is always fp32)."""
    data: Optional[str] = None
    """Shard folder from `gptforge prepare`: loss / perplexity / bits per byte on --split. A folder
    prepared with several --source: per source, on the run's validation windows (as training
    logs val/NAME/loss), and overall the token-weighted mean over the sources' splits."""
    text: Optional[str] = None
    """A text file, tokenized with the run's tokenizer: loss / perplexity / bits per byte (binary files
    are refused)."""
    encoding: Optional[str] = None
    """Encoding of --text when it has no byte-order mark (default UTF-8; UTF-16/32 with a BOM are decoded)."""
    split: Literal["train", "val", "test"] = "val"
    """Split of --data."""
    stride: Optional[int] = bounded(None, low=1)
    """Window shift in tokens for --data/--text (default block_size/2)."""
    batch_size: Optional[int] = bounded(None, low=1)
    """Sequences per forward pass (default 8 windows for --data/--text, 32 for --tasks)."""
    max_tokens: Optional[int] = bounded(None, low=2)
    """Score only the first N tokens of --data/--text (for a quick look)."""
    best: bool = False
    """Use checkpoints/best instead of latest."""
    device: str = "auto"
    """auto, cpu, cuda, mps."""
    json: bool = False
    """Print the result as JSON."""
    quiet: bool = False
    """No progress bars (on a terminal) or progress lines (otherwise) on stderr."""


def main(argv: list[str]) -> int:
    from gptforge.errors import InputError, OptionError
    from gptforge.options import command_parser, parse_command

    opts, _ = parse_command(command_parser("gptforge evaluate", DESCRIPTION, EvaluateOptions, positional=("model",)),
                            argv)
    from gptforge.progress import set_quiet

    set_quiet(opts.quiet)
    chosen = [k for k in ("tasks", "harness", "data", "text") if getattr(opts, k)]
    if len(chosen) != 1:
        raise OptionError("give exactly one of --tasks FILE..., --harness TASK..., --data DIR or --text FILE"
                         + (f" (got {', '.join('--' + c for c in chosen)})" if chosen else ""))
    if opts.chat and not opts.tasks:
        raise OptionError("--chat scores task files: give --tasks FILE...")
    from gptforge.eval.model_source import check_results_out

    check_results_out(opts.out)
    if opts.out and os.path.isdir(opts.out):  # refused before the model is loaded and scored
        raise InputError(f"--out {opts.out} is a folder: give the path of a JSON file, such as "
                         f"{os.path.join(opts.out, 'results.json')}")
    common = dict(batch_size=opts.batch_size, precision=opts.precision, device=opts.device, best=opts.best,
                  out=opts.out)
    if opts.tasks:
        from gptforge.eval.task_report import evaluate_tasks

        doc, report = evaluate_tasks(opts.model, opts.tasks, num_fewshot=opts.num_fewshot, limit=opts.limit,
                                     seed=opts.seed, contamination=opts.contamination,
                                     contamination_ngram=opts.contamination_ngram, chat=opts.chat,
                                     chat_template=opts.chat_template, num_samples=opts.num_samples,
                                     temperature=opts.temperature, **common)
    elif opts.harness:
        from gptforge.eval.task_report import evaluate_harness

        doc, report = evaluate_harness(opts.model, opts.harness, include_path=opts.include_path,
                                       num_fewshot=opts.num_fewshot, limit=opts.limit, seed=opts.seed, **common)
    else:
        from gptforge.eval.text_perplexity import evaluate_perplexity

        doc, report = evaluate_perplexity(opts.model, data=opts.data, text=opts.text, split=opts.split,
                                          encoding=opts.encoding, stride=opts.stride, max_tokens=opts.max_tokens,
                                          **common)
    print(json.dumps(doc, indent=2, default=str) if opts.json else report)
    return 0
