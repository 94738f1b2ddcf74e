"""Benchmark tasks scored on a model and recorded (`gptforge evaluate --tasks / --harness`): the
results document with its checkpoint fingerprint and versions, merged into results.json, the
contamination check, and the report printed. The scoring itself is `gptforge.eval.runner` and
`gptforge.eval.harness`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from gptforge.errors import InputError, MissingInputError, OptionError
from gptforge.eval.model_source import load_eval_model, results_path, tree_sha256


def _model_and_tokenizer(model: str, device: str, best: bool, chat_template: str | None = None):
    """(model, checkpoint path, device, Tokenizer, chat format or None); a missing tokenizer.json is a
    MissingInputError. With `chat_template` (auto, default or a file), the chat format is
    `gptforge.eval.chat.load_chat_format`'s."""
    from gptforge.data.tokenizer import Tokenizer
    from gptforge.runtime.device import pick_device

    dev = pick_device(device, "--device")
    net, ckpt, doc, tok_path = load_eval_model(model, dev, best)
    if tok_path is None:
        raise MissingInputError(f"no tokenizer.json found for {ckpt} (checkpoint, run directory, data folder)")
    chat = None
    if chat_template is not None:
        from gptforge.eval.chat import load_chat_format

        chat = load_chat_format(model, Path(tok_path), doc, chat_template)
    return net, ckpt, dev, Tokenizer.from_file(tok_path), chat


def evaluate_harness(model: str, harness: list[str], *, include_path: str | None = None, num_fewshot: int = 0,
                     limit: int | None = None, seed: int = 1234, batch_size: int | None = None,
                     precision: str = "fp32", device: str = "auto", best: bool = False,
                     out: str | None = None) -> tuple[dict, str]:
    """(recorded results, lm-eval's table plus where they went) of lm-evaluation-harness tasks
    `harness` run on `model`; the arguments are `gptforge evaluate`'s options of the same name.
    The results merge into results.json (`gptforge.eval.results_file.record_results`).

    Raises:
        MissingInputError: no tokenizer.json for the model; errors of `gptforge.eval.harness.run_harness`.
    """
    from gptforge.eval.harness import run_harness
    from gptforge.eval.results_file import record_results

    net, ckpt, dev, tok, _ = _model_and_tokenizer(model, device, best)
    res = run_harness(net, tok, harness, include_path, num_fewshot, limit, dev, precision, batch_size or 32, seed)
    from lm_eval.utils import make_table

    path = results_path(model, out)
    keep = {k: res[k] for k in ("results", "n-shot", "n-samples", "versions", "higher_is_better") if k in res}
    keep["checkpoint"], keep["checkpoint_sha256"] = str(ckpt), tree_sha256(Path(ckpt))
    keep = json.loads(json.dumps(keep, default=str))  # lm-eval's values as JSON (numpy scalars as text)
    record_results(path, keep)  # merged with earlier calls' tasks; each call also in results.history.jsonl
    return keep, f"{make_table(res)}\nresults: {path}"


def evaluate_tasks(model: str, task_files: list[str], *, num_fewshot: int = 0, limit: int | None = None,
                   seed: int = 1234, batch_size: int | None = None, precision: str = "fp32", device: str = "auto",
                   best: bool = False, out: str | None = None, contamination: str | None = None,
                   contamination_ngram: int = 13, chat: bool = False, chat_template: str = "auto",
                   num_samples: int = 1, temperature: float | None = None) -> tuple[dict, str]:
    """(this call's results document, report) of task files scored on `model`; the arguments are
    `gptforge evaluate`'s options of the same name. The document (checkpoint and its SHA-256,
    settings, versions, per-task metrics, an aggregate over several tasks, contamination) merges
    into results.json beside earlier calls' other tasks; predictions into results.predictions.json.
    With `chat` (`gptforge.eval.chat_runner`) the default file is chat_results.json instead, so
    plain and chat scores of the same task are both kept; temperature None is 0 (greedy) for one
    sample and 1.0 for several.

    Raises:
        InputError: two tasks share a name; errors of `gptforge.eval.tasks.load_task` (read before
            the model loads).
        OptionError: --num-samples or --temperature without chat, or several greedy samples.
        MissingInputError: no tokenizer.json for the model or the contamination folder.
    """
    import platform

    import torch

    import gptforge
    from gptforge.eval.results_file import merge_predictions, record_results
    from gptforge.eval.runner import aggregate, run_task
    from gptforge.eval.tasks import load_task

    tasks = [load_task(t) for t in task_files]  # read every file before loading the model
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise InputError(f"two tasks share a name ({sorted(n for n in names if names.count(n) > 1)[0]!r}); "
                         "give one a `name:` in a YAML task definition")
    if not chat and (num_samples != 1 or temperature is not None):
        raise OptionError("--num-samples and --temperature sample chat replies: add --chat")
    if temperature is None:
        temperature = 0.0 if num_samples == 1 else 1.0
    if num_samples > 1 and temperature <= 0:
        raise OptionError(f"--num-samples {num_samples} with --temperature 0 gives {num_samples} identical greedy "
                         "replies; give --temperature above 0 (e.g. 0.8)")
    net, ckpt, dev, tok, fmt = _model_and_tokenizer(model, device, best, chat_template if chat else None)
    results = [run_task(net, tok, t, dev, precision, batch_size or 32, num_fewshot, limit, seed, progress=True,
                        chat=fmt, num_samples=num_samples, temperature=temperature) for t in tasks]
    agg = aggregate(results) if len(results) > 1 else None
    found = _contamination(contamination, contamination_ngram, tasks, results) if contamination else None
    doc = {
        "checkpoint": str(ckpt), "checkpoint_sha256": tree_sha256(Path(ckpt)), "num_fewshot": num_fewshot,
        "seed": seed, "limit": limit, "batch_size": batch_size or 32, "precision": precision, "device": str(dev),
        "versions": {"gptforge": gptforge.__version__, "torch": torch.__version__, "python": platform.python_version()},
        "tasks": {r.name: r.as_dict() for r in results},
    }
    if chat:
        doc["chat"] = {"template": chat_template, "num_samples": num_samples, "temperature": temperature}
    if agg:
        doc["aggregate"] = agg
    if found:
        doc["contamination"] = found
    path = results_path(model, out, "chat_results.json" if chat else "results.json")
    merged = record_results(path, doc)  # earlier calls' other tasks kept; each call in results.history.jsonl
    merge_predictions(path.with_name(path.stem + ".predictions.json"), {r.name: r.predictions for r in results})
    earlier = sorted(set(merged["tasks"]) - {r.name for r in results})
    return doc, _tasks_report(doc, results, agg, net.config.block_size, contamination, path, earlier)


def _tasks_report(doc: dict, results, agg, block_size: int, contamination: str | None, path: Path,
                  earlier: list[str]) -> str:
    """The table of task scores, truncation and contamination notes, and where the results went."""
    from gptforge.eval.runner import format_table

    lines = [format_table(results, agg)]
    for r in results:
        if r.truncated:
            lines.append(f"{r.name}: {r.truncated} requests had their context truncated from the left to fit "
                         f"block_size {block_size}")
    found = doc.get("contamination")
    for name, rec in (found["tasks"].items() if found else ()):
        clean = doc["tasks"][name]["clean"]
        figures = ", ".join(f"{m} {v['value']:.4f}" for m, v in clean["metrics"].items() if "/" not in m)
        lines.append(f"{name}: {rec['contaminated']} of {doc['tasks'][name]['n']} examples share a "
                     f"{found['ngram']}-gram with {contamination} [{found['split']}]"
                     f" ({rec['too_short']} too short to check); clean subset (n {clean['n']}): {figures or 'empty'}")
    lines.append(f"results: {path}" + (f" (also holds earlier results of {', '.join(earlier)})" if earlier else ""))
    return "\n".join(lines)


def _contamination(folder: str, ngram: int, tasks, results) -> dict:
    """Contaminated examples per task against the train split of shard folder `folder` (and each
    result's `clean` metrics, set on it)."""
    from gptforge.data.tokenizer import Tokenizer
    from gptforge.eval.contamination import find_contamination
    from gptforge.eval.runner import subset_metrics

    tok_file = Path(folder) / "tokenizer.json"
    if not tok_file.is_file():
        raise MissingInputError(f"--contamination {folder}: no tokenizer.json (a `gptforge prepare` folder)")
    data_tok = Tokenizer.from_file(tok_file)
    texts = {t.name: [e.demo for e in t.examples[:r.n]] for t, r in zip(tasks, results, strict=True)}
    tokens: dict[str, Sequence[Sequence[int]]] = {name: data_tok.encode_batch(v) for name, v in texts.items()}
    report = find_contamination(tokens, folder, n=ngram, progress=True)
    lines = {t.name: [e.line for e in t.examples[:r.n]] for t, r in zip(tasks, results, strict=True)}
    for t, r in zip(tasks, results, strict=True):
        bad = set(report.contaminated[t.name])
        keep = [i for i in range(r.n) if i not in bad]
        r.clean = {"n": len(keep), "metrics": subset_metrics(t, r, keep)}
    return report.as_dict(lines)
