"""`gptforge evaluate MODEL (--tasks T1 T2 ... | --harness TASK ... | --data DIR [--split val|test] | --text FILE)`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

from gptforge.options import bounded

DESCRIPTION = """Score a run, checkpoint or Hugging Face folder on benchmark task files (--tasks:
multiple choice, classification, generation, cloze; acc / acc_norm / F1 / exact match with stderr
and n, lm-evaluation-harness's conventions; results.json in MODEL/eval/), or measure loss
(nats/token), perplexity and bits per byte over a split of a shard folder (--data) or a text file
(--text), with windows of block_size tokens sliding by --stride so every token is scored once.
Task formats: jsonl {context, choices, label}; HellaSwag, ARC and PIQA/WinoGrande jsonl; MMLU csv;
{text, label} classification; {prompt, answer} generation; {text} cloze (last word); or a YAML
task definition (data, type, prompt, labels, fewshot_data, ...; type: perplexity for documents)."""


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


def _load(opts: EvaluateOptions, device):
    """(model, checkpoint path, saved config dict, tokenizer.json path or None) for a run or an HF folder."""
    from gptforge.runtime.loading import load_for_inference, load_pretrained

    path = Path(opts.model)
    if (path / "config.json").is_file() and not (path / "config.yaml").is_file():
        model, src = load_pretrained(path)
        tok = src["tokenizer_dir"] / "tokenizer.json" if src["tokenizer_dir"] else None
        return model.to(device).eval(), path, {}, tok if tok is not None and tok.is_file() else None
    return load_for_inference(opts.model, device, "best" if opts.best else "latest")


def main(argv: list[str]) -> int:
    from gptforge.errors import InputError
    from gptforge.options import command_parser, parse_command

    opts, _ = parse_command(command_parser("gptforge evaluate", DESCRIPTION, EvaluateOptions, positional=("model",)),
                            argv)
    from gptforge.progress import set_quiet

    set_quiet(opts.quiet)
    chosen = [k for k in ("tasks", "harness", "data", "text") if getattr(opts, k)]
    if len(chosen) != 1:
        raise InputError("give exactly one of --tasks FILE..., --harness TASK..., --data DIR or --text FILE"
                         + (f" (got {', '.join('--' + c for c in chosen)})" if chosen else ""))
    if opts.tasks:
        return _tasks(opts)
    if opts.harness:
        return _harness(opts)
    return _perplexity(opts)


def _out_path(opts: EvaluateOptions) -> Path:
    model_dir = Path(opts.model)
    if model_dir.parent.name == "checkpoints":  # a step folder: results beside it in the run, not inside it
        model_dir = model_dir.parent.parent
    return Path(opts.out) if opts.out else model_dir / "eval" / "results.json"


def _harness(opts: EvaluateOptions) -> int:
    from gptforge.data.tokenizer import Tokenizer
    from gptforge.errors import MissingInputError
    from gptforge.eval.harness import run_harness
    from gptforge.eval.results_file import record_results
    from gptforge.runtime.device import pick_device

    device = pick_device(opts.device)
    model, ckpt, _doc, tok_path = _load(opts, device)
    if tok_path is None:
        raise MissingInputError(f"no tokenizer.json found for {ckpt} (checkpoint, run directory, data folder)")
    res = run_harness(model, Tokenizer.from_file(tok_path), opts.harness, opts.include_path,
                      opts.num_fewshot, opts.limit, device, opts.precision, opts.batch_size or 32, opts.seed)
    from lm_eval.utils import make_table

    out = _out_path(opts)
    keep = {k: res[k] for k in ("results", "n-shot", "n-samples", "versions", "higher_is_better") if k in res}
    keep["checkpoint"], keep["checkpoint_sha256"] = str(ckpt), _tree_sha256(Path(ckpt))
    keep = json.loads(json.dumps(keep, default=str))  # lm-eval's values as JSON (numpy scalars as text)
    record_results(out, keep)  # merged with earlier calls' tasks; each call also in results.history.jsonl
    if opts.json:
        print(json.dumps(keep, indent=2, default=str))
    else:
        print(make_table(res))
        print(f"results: {out}")
    return 0


def _tasks(opts: EvaluateOptions) -> int:
    import platform

    import torch

    import gptforge
    from gptforge.data.tokenizer import Tokenizer
    from gptforge.errors import InputError, MissingInputError
    from gptforge.eval.results_file import merge_predictions, record_results
    from gptforge.eval.runner import aggregate, format_table, run_task
    from gptforge.eval.tasks import load_task
    from gptforge.runtime.device import pick_device

    tasks = [load_task(t) for t in opts.tasks]  # read every file before loading the model
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise InputError(f"two tasks share a name ({sorted(n for n in names if names.count(n) > 1)[0]!r}); "
                         "give one a `name:` in a YAML task definition")
    device = pick_device(opts.device)
    model, ckpt, _doc, tok_path = _load(opts, device)
    if tok_path is None:
        raise MissingInputError(f"no tokenizer.json found for {ckpt} (checkpoint, run directory, data folder)")
    tok = Tokenizer.from_file(tok_path)
    results = [run_task(model, tok, t, device, opts.precision, opts.batch_size or 32, opts.num_fewshot, opts.limit,
                        opts.seed, progress=True) for t in tasks]
    agg = aggregate(results) if len(results) > 1 else None
    contamination = _contamination(opts, tasks, results) if opts.contamination else None
    doc = {
        "checkpoint": str(ckpt), "checkpoint_sha256": _tree_sha256(Path(ckpt)), "num_fewshot": opts.num_fewshot,
        "seed": opts.seed, "limit": opts.limit, "batch_size": opts.batch_size or 32, "precision": opts.precision,
        "device": str(device),
        "versions": {"gptforge": gptforge.__version__, "torch": torch.__version__, "python": platform.python_version()},
        "tasks": {r.name: r.as_dict() for r in results},
    }
    if agg:
        doc["aggregate"] = agg
    if contamination:
        doc["contamination"] = contamination
    out = _out_path(opts)
    merged = record_results(out, doc)  # earlier calls' other tasks kept; each call in results.history.jsonl
    merge_predictions(out.with_name(out.stem + ".predictions.json"), {r.name: r.predictions for r in results})
    if opts.json:
        print(json.dumps(doc, indent=2))
    else:
        print(format_table(results, agg))
        for r in results:
            if r.truncated:
                print(f"{r.name}: {r.truncated} requests had their context truncated from the left to fit "
                      f"block_size {model.config.block_size}")
        if contamination:
            for name, rec in contamination["tasks"].items():
                clean = doc["tasks"][name]["clean"]
                figures = ", ".join(f"{m} {v['value']:.4f}" for m, v in clean["metrics"].items() if "/" not in m)
                print(f"{name}: {rec['contaminated']} of {doc['tasks'][name]['n']} examples share a "
                      f"{contamination['ngram']}-gram with {opts.contamination} [{contamination['split']}]"
                      f" ({rec['too_short']} too short to check); clean subset (n {clean['n']}): {figures or 'empty'}")
        earlier = sorted(set(merged["tasks"]) - {r.name for r in results})
        print(f"results: {out}" + (f" (also holds earlier results of {', '.join(earlier)})" if earlier else ""))
    return 0


def _contamination(opts: EvaluateOptions, tasks, results) -> dict:
    """Contaminated examples per task (and each result's `clean` metrics, set on its dict)."""
    from gptforge.data.tokenizer import Tokenizer
    from gptforge.errors import MissingInputError
    from gptforge.eval.contamination import find_contamination
    from gptforge.eval.runner import subset_metrics

    tok_file = Path(opts.contamination) / "tokenizer.json"
    if not tok_file.is_file():
        raise MissingInputError(f"--contamination {opts.contamination}: no tokenizer.json (a `gptforge prepare` folder)")
    data_tok = Tokenizer.from_file(tok_file)
    texts = {t.name: [e.demo for e in t.examples[:r.n]] for t, r in zip(tasks, results)}
    tokens = {name: data_tok.encode_batch(v) for name, v in texts.items()}
    report = find_contamination(tokens, opts.contamination, n=opts.contamination_ngram, progress=True)
    lines = {t.name: [e.line for e in t.examples[:r.n]] for t, r in zip(tasks, results)}
    for t, r in zip(tasks, results):
        bad = set(report.contaminated[t.name])
        keep = [i for i in range(r.n) if i not in bad]
        r.clean = {"n": len(keep), "metrics": subset_metrics(t, r, keep)}
    return report.as_dict(lines)


def _tree_sha256(path: Path) -> str:
    """SHA-256 over a checkpoint folder's files (relative names and bytes, sorted), or one file."""
    import hashlib

    from gptforge.atomic import file_sha256

    if path.is_file():
        return file_sha256(path)
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode() + b"\0" + file_sha256(f).encode())
    return h.hexdigest()


def _normalize_like_prepare(text: str, doc: dict) -> tuple[str, str]:
    """(text, description): `text` normalized as `gptforge prepare` normalized the run's training
    data (`gptforge.data.normalize.normalize_text`: BOM removed, CRLF / CR -> LF, then the recipe's
    Unicode form read from the data folder's meta.json). Without a recorded recipe (a Hugging Face
    folder, a moved data folder) only the BOM and line ends are normalized."""
    from gptforge.data.normalize import normalize_text, prepared_normalization

    data = (doc.get("data") or {}).get("path")
    meta_path = Path(data) / "meta.json" if data else None
    form = None
    if meta_path is not None and meta_path.is_file():
        try:
            form = prepared_normalization(json.loads(meta_path.read_text()))
        except ValueError:  # an unreadable meta.json: fall back to the line ends
            form = None
    what = "BOM removed, line ends LF"
    if form:
        what += f", Unicode {form} (the recipe's, from {meta_path})"
    elif form == "":
        what += f" (the recipe applied no Unicode form, {meta_path})"
    else:
        what += " (no prepare recipe recorded for this model: no Unicode form applied)"
    return normalize_text(text, form or ""), what


def _perplexity(opts: EvaluateOptions) -> int:
    import numpy as np

    from gptforge.data.loader import TokenStream
    from gptforge.errors import InputError, MissingInputError
    from gptforge.eval.perplexity import evaluate_tokens
    from gptforge.runtime.device import pick_device

    device = pick_device(opts.device)
    model, ckpt, doc, tok_path = _load(opts, device)
    if opts.data:
        from gptforge.data.mixture import mixture_folders

        folders = mixture_folders(opts.data)
        if folders is not None:
            return _perplexity_per_source(opts, model, ckpt, doc, folders, device)
    if opts.data:
        from gptforge.data.shards import load_meta

        try:
            meta = load_meta(opts.data)
        except ValueError as e:  # not JSON / not a shard folder: the message names the file
            raise InputError(str(e)) from None
        run_tok = (doc.get("data") or {}).get("tokenizer_sha256")
        if run_tok and meta.get("tokenizer_sha256") and run_tok != meta["tokenizer_sha256"]:
            raise InputError(
                f"{opts.data} was tokenized with another tokenizer (sha256 {meta['tokenizer_sha256'][:12]}) "
                f"than the model was trained with ({run_tok[:12]}); evaluate on data prepared with "
                "--tokenizer RUN_DIR/tokenizer.json, or use --text FILE"
            )
        split = meta["splits"].get(opts.split)
        if not split or not split.get("tokens"):
            raise InputError(f"{Path(opts.data) / 'meta.json'}: split {opts.split!r} is empty")
        stream = TokenStream([Path(opts.data) / f for f in split["files"]], meta["dtype"])
        n = stream.num_tokens if opts.max_tokens is None else min(opts.max_tokens, stream.num_tokens)
        tokens = stream.read(0, n)
        stream.close()
        n_bytes = split["bytes"] if n == split["tokens"] else None
        source = f"{opts.data} [{opts.split}]"
        eos_id = int(meta["eos_id"])
    else:
        if tok_path is None:
            raise MissingInputError(f"no tokenizer.json found for {ckpt}; evaluate with --data instead")
        from gptforge.data.tokenizer import Tokenizer

        path = Path(opts.text)
        if not path.is_file():
            raise MissingInputError(f"--text {path}: no such file")
        from gptforge.data.readers import read_text_file

        text = read_text_file(path, encoding=opts.encoding)  # binary files refused; a BOM decoded
        file_bytes = len(text.encode("utf-8"))
        text, normalization = _normalize_like_prepare(text, doc)
        tok = Tokenizer.from_file(tok_path)
        tokens = np.array(tok.encode(text), dtype=np.int64)
        eos_id = tok.eos_id
        if opts.max_tokens is not None:
            tokens = tokens[: opts.max_tokens]
        n_bytes = len(text.encode("utf-8")) if opts.max_tokens is None else None
        source = str(path)
    try:
        # A run trained with train.document_mask is scored under the same mask.
        masked = bool((doc.get("train") or {}).get("document_mask"))
        result = evaluate_tokens(model, tokens, n_bytes=n_bytes, stride=opts.stride, batch_size=opts.batch_size or 8,
                                 device=device, progress=True, document_mask_eos=eos_id if masked else None)
    except ValueError as e:  # stride out of range, fewer than 2 tokens
        raise InputError(f"{source}: {e}") from None
    out = dict(result.as_dict(), checkpoint=str(ckpt), source=source)
    if opts.text:
        out.update(normalization=normalization, text_bytes=len(text.encode("utf-8")), file_text_bytes=file_bytes)
    if opts.out:  # a perplexity measurement is written only where asked (tasks merge into results.json)
        from gptforge.atomic import atomic_write_json

        Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(Path(opts.out), out)
    if opts.json:
        print(json.dumps(out, indent=2))
    else:
        bpb = f"{result.bits_per_byte:.4f}" if result.bits_per_byte is not None else "n/a (partial split)"
        print(f"{source}: {result.tokens:,} tokens scored with {ckpt}")
        if opts.text:
            print(f"  text normalized as prepare normalized the training data: {normalization}; bits per byte "
                  f"over the {out['text_bytes']:,} UTF-8 bytes after normalization ({file_bytes:,} as read)")
        print(f"  loss {result.loss:.4f} nats/token | perplexity {result.perplexity:.2f} | bits per byte {bpb}")
    return 0


def _perplexity_per_source(opts: EvaluateOptions, model, ckpt, doc: dict, folders: dict, device) -> int:
    """--data of a mixture: each source's loss and bits per byte on the run's validation windows
    (gptforge.eval.perplexity.evaluate_mixture) and the overall token-weighted mean."""
    from gptforge.errors import InputError
    from gptforge.eval.perplexity import evaluate_mixture

    train = doc.get("train") or {}
    n_windows = int(train.get("eval_steps") or 20) * int(train.get("micro_batch_size") or 8)
    try:
        res = evaluate_mixture(model, folders, opts.split, n_windows, opts.batch_size or int(train.get("micro_batch_size")
                                                                                              or 8),
                               device, opts.precision, bool(train.get("document_mask")))
    except ValueError as e:
        raise InputError(str(e)) from None
    out = dict(res, checkpoint=str(ckpt), source=f"{opts.data} [{opts.split}]")
    if opts.out:
        from gptforge.atomic import atomic_write_json

        Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(Path(opts.out), out)
    if opts.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{out['source']}: {len(res['sources'])} sources scored with {ckpt} on {n_windows} windows each "
          "(train.eval_steps x micro_batch_size, as training's validation)")
    for name, r in res["sources"].items():
        bpb = f"{r['bits_per_byte']:.4f}" if r["bits_per_byte"] is not None else "n/a"
        note = f" (the split holds {r['windows']} windows: each scored once)" if r["windows"] < n_windows else ""
        print(f"  {name}: loss {r['loss']:.4f} nats/token | bits per byte {bpb}{note}")
    if res["loss"] is not None:
        print(f"  overall: loss {res['loss']:.4f} (the token-weighted mean over the sources' {opts.split} splits)")
    return 0
