"""The end of a run: a few continuations of the trained model (samples.json) and the run report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from gptforge.atomic import atomic_write_text

if TYPE_CHECKING:
    from gptforge.model.gpt import GPT

SAMPLE_PROMPTS = ("", "The ", "def ")
"""Fallback prompts of the end-of-run samples ("": from the end-of-text token), used when the
run's data gives no document prefixes."""


def sample_prompts(data_dir: Path | None, tok) -> tuple[str, list[tuple[str, list[int]]]]:
    """(where the prompts come from, [(prompt text, prompt ids)]): the end-of-text token plus
    the first tokens of the first 3 val documents (train when there is no val) of the run's
    shard folder `data_dir` (gptforge.data.loader.document_prefixes); else SAMPLE_PROMPTS.
    tok: the run's gptforge.data.tokenizer.Tokenizer."""
    from gptforge.data.loader import document_prefixes

    split, prefixes = document_prefixes(data_dir) if data_dir is not None else ("", [])
    if prefixes and all(0 <= i < tok.vocab_size for p in prefixes for i in p):
        return (f"first tokens of {len(prefixes)} {split} documents of {data_dir}",
                [("", [tok.eos_id])] + [(tok.decode(p), p) for p in prefixes])
    return ("fixed prompts (no documents in the run's data)",
            [(p, tok.encode(p) if p else [tok.eos_id]) for p in SAMPLE_PROMPTS])


def write_samples(run_dir: Path, model: GPT, device: torch.device, data_dir: Path | None, step: int,
                  max_new_tokens: int = 32) -> None:
    """RUN/samples.json: a greedy and a sampled continuation (temperature 0.8, seed 0) of each
    prompt of `sample_prompts` (its origin in "prompt_source"), for the run report; `step` is
    the model's optimizer step. `model`: the whole (unsharded) model; its train/eval mode is
    restored. A compiled model decodes eagerly (`torch.compiler.set_stance("force_eager")`): its
    training graph does not fit decoding's growing KV cache, and recompiling per length costs more
    than these few tokens. Skipped when the run has no tokenizer.json."""
    tok_file = run_dir / "tokenizer.json"
    if not tok_file.is_file():
        return
    from gptforge.data.tokenizer import Tokenizer

    tok = Tokenizer.from_file(tok_file)
    source, prompts = sample_prompts(data_dir, tok)
    was = model.training
    model.eval()
    with torch.compiler.set_stance("force_eager"):
        out = _continuations(model, device, tok, prompts, max_new_tokens)
    model.train(was)
    atomic_write_text(run_dir / "samples.json",
                      json.dumps({"step": step, "prompt_source": source, "samples": out},
                                 indent=2, ensure_ascii=False) + "\n")


def _continuations(model: GPT, device: torch.device, tok, prompts: list[tuple[str, list[int]]],
                   max_new_tokens: int) -> list[dict]:
    """A greedy and a sampled (temperature 0.8, seed 0) continuation of each prompt."""
    from gptforge.infer.generate import generate

    out = []
    for prompt, ids in prompts:
        idx = torch.tensor([ids], dtype=torch.long, device=device)
        for mode, temp in (("greedy", 0.0), ("sampled", 0.8)):
            new = generate(model, idx, max_new_tokens, temperature=temp, seed=0)[0, len(ids):].tolist()
            out.append({"prompt": prompt, "mode": mode, "text": tok.decode(new)})
    return out


def write_run_end(run_dir: Path, stopped: str | None, model: GPT | None, device: torch.device,
                  data_dir: Path | None, step: int) -> Path:
    """The end-of-run outputs of rank 0: samples.json (`write_samples`, when `model` is given) and
    the run report (gptforge.report.write_run_report), however the run ended.

    Args:
        stopped: how the run ended (TrainResult.stopped), or None when it failed before a step.
        model: the whole trained model, or None when it is sharded over ranks (no samples then).
        data_dir: the run's shard folder (prompts of the samples), or None. step: its optimizer step.

    Returns: the report's path.
    """
    from gptforge.report import write_run_report

    if model is not None:
        write_samples(run_dir, model, device, data_dir, step)
    return write_run_report(run_dir, stopped=stopped)
