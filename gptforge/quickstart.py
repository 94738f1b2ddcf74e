"""The built-in default job: the Python standard library -> tokenizer -> small GPT -> eval -> samples.

Every Python installation ships its standard library's source: English docstrings and comments
mixed with code, about 12 MB without the test suites. That is enough real text for a small model
to learn visibly on a laptop CPU in minutes, with no download.

The number of optimizer steps is set from a measured step time so that the learning-rate schedule
(warmup, cosine decay) completes inside the time budget.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from gptforge.config import ModelConfig, RunConfig, TrainConfig


@dataclass
class QuickstartResult:
    data_dir: Path
    run_dir: Path
    checkpoint: Path
    val_loss: float
    val_bits_per_byte: float | None
    unigram_entropy: float
    steps: int
    train_seconds: float
    samples: list[str]


def run_quickstart(out: Path, minutes: float = 10.0, vocab_size: int = 4096, preset: str = "qwen3-micro",
                   micro_batch_size: int = 16, block_size: int = 256, max_files: int | None = None,
                   workers: int = 0, steps: int | None = None, progress: bool = True,
                   log: Callable[[str], None] = print, optimizer: str = "muon") -> QuickstartResult:
    """Prepare the standard-library corpus, train `preset` for about `minutes`, evaluate, sample.

    The default recipe (qwen3-micro + Muon, the size-aware learning rates of
    gptforge.train.optim.resolve_defaults): Qwen3 blocks, which export exactly to hf, gguf and
    onnx; bench/learning_efficiency.py compares it with modern-micro + Muon (not exportable) and
    gpt2-micro + AdamW at equal CPU seconds ("Recommended recipe" in bench/RESULTS.md).

    Args:
        out: folder for `data/` (shards) and `run/` (the training run).
        minutes: training time budget (preparation and evaluation come on top: about a minute).
        optimizer: train.optimizer (muon: Muon on the hidden matrices, AdamW on the rest).
        max_files: use only N library files (for quick trials and tests).
        steps: a fixed number of optimizer steps instead of the time budget.

    Raises:
        FileNotFoundError: this Python ships no standard-library sources.
    """
    from gptforge.data.loader import TokenStream
    from gptforge.data.prepare import PrepareConfig, prepare
    from gptforge.data.shards import load_meta
    from gptforge.data.stdlib_corpus import stdlib_files
    from gptforge.data.tokenizer import Tokenizer
    from gptforge.eval.perplexity import evaluate_tokens, unigram_entropy
    from gptforge.infer.generate import generate
    from gptforge.runtime.checkpoint import find_checkpoint
    from gptforge.runtime.loading import load_for_inference
    from gptforge.train.budget import measure_step_seconds, steps_for_minutes
    from gptforge.train.loop import train
    from gptforge.train.optim import resolve_lr_defaults

    out = Path(out)
    data_dir, run_dir = out / "data", out / "run"
    files = stdlib_files()
    if max_files:
        files = files[:: max(1, len(files) // max_files)][:max_files]
    inputs = [str(f) for f in files]
    old = load_meta(data_dir) if (data_dir / "meta.json").exists() else None
    if old and old["vocab_size"] == vocab_size and old.get("prepare_config", {}).get("inputs") == inputs:
        log(f"[1/4] reusing the prepared corpus in {data_dir} (same files and vocabulary)")
    else:
        log(f"[1/4] preparing {len(files)} standard-library source files -> {data_dir}")
        prepare(PrepareConfig(inputs=inputs, out=str(data_dir), vocab_size=vocab_size,
                              val_fraction=0.02, seed=1337, workers=workers, overwrite=True, recipe="code"),
                show_progress=progress)
    meta = load_meta(data_dir)

    model_cfg = ModelConfig(preset=preset, block_size=block_size, vocab_size=meta["vocab_size"])
    # The timing probe's optimizer runs at the run's own size-aware lr (the lr does not change the timing).
    probe = resolve_lr_defaults(model_cfg, TrainConfig(micro_batch_size=micro_batch_size, optimizer=optimizer))
    # A busy machine can make all-core OpenMP slower than one thread: time both, keep the faster.
    timings = {}
    for threads in dict.fromkeys([torch.get_num_threads(), 1]):
        torch.set_num_threads(threads)
        timings[threads] = measure_step_seconds(model_cfg, probe)
    threads = min(timings, key=timings.get)
    torch.set_num_threads(threads)
    step_s = timings[threads]
    # Evaluations take ~10% of the budget; the rest is optimizer steps.
    max_steps = steps or steps_for_minutes(minutes, step_s)
    # lr, min_lr, warmup and muon_lr unset: the size-aware defaults (printed at the start of training).
    tc = TrainConfig(max_steps=max_steps, micro_batch_size=micro_batch_size, optimizer=optimizer,
                     weight_decay=0.1, eval_interval=max(10, max_steps // 10),
                     eval_steps=8, checkpoint_interval=max(50, max_steps // 4), seed=1337, num_threads=threads)
    log(f"[2/4] training {preset} with {optimizer} (block_size {block_size}, batch {micro_batch_size}) for {max_steps} steps: "
        f"{step_s:.3f} s/step measured with {threads} thread(s), about {max_steps * step_s / 60:.1f} min")
    if run_dir.exists():  # the quickstart's own folder: a rerun starts a fresh run
        log(f"      replacing the previous quickstart run in {run_dir}")
        shutil.rmtree(run_dir)
    t0 = time.perf_counter()
    result = train(RunConfig(model=model_cfg, train=tc), data_dir, run_dir, progress=progress, log=log)
    train_seconds = time.perf_counter() - t0

    log("[3/4] evaluating on the whole val split")
    model, ckpt, _doc, tok_path = load_for_inference(run_dir, "cpu")
    val = meta["splits"]["val"]
    vs = TokenStream([data_dir / f for f in val["files"]], meta["dtype"])
    val_tokens = vs.read(0, vs.num_tokens)
    vs.close()
    ev = evaluate_tokens(model, val_tokens, n_bytes=val["bytes"], progress=progress)
    tr = meta["splits"]["train"]
    ts = TokenStream([data_dir / f for f in tr["files"]], meta["dtype"])
    train_tokens = ts.read(0, ts.num_tokens)
    ts.close()
    h1 = unigram_entropy(val_tokens[1:], meta["vocab_size"], reference=train_tokens)
    log(f"      val loss {ev.loss:.3f} nats/token (perplexity {ev.perplexity:.1f}, {ev.bits_per_byte:.3f} bits/byte) "
        f"vs unigram entropy {h1:.3f} nats/token (a model of token frequencies alone)")

    log("[4/4] samples (temperature 0.8, top-k 50):")
    tok = Tokenizer.from_file(tok_path)
    samples = []
    for i, prompt in enumerate(["def ", "class ", '"""Return the ']):
        ids = torch.tensor([tok.encode(prompt)])
        outp = generate(model, ids, 80, temperature=0.8, top_k=50, seed=i)
        text = prompt + tok.decode(outp[0, ids.size(1):].tolist())
        samples.append(text)
        log(f"--- prompt {prompt!r}\n{text}")
    log(f"\nrun directory: {run_dir}\n  checkpoint:  {find_checkpoint(run_dir)}\n"
        f"  metrics:     {run_dir / 'metrics.jsonl'}\n  TensorBoard: tensorboard --logdir {run_dir / 'tb'}\n"
        f"next: gptforge generate {run_dir} --prompt 'def '   |   gptforge evaluate {run_dir} --data {data_dir}")
    return QuickstartResult(data_dir=data_dir, run_dir=run_dir, checkpoint=ckpt, val_loss=ev.loss,
                            val_bits_per_byte=ev.bits_per_byte, unigram_entropy=h1, steps=result.step,
                            train_seconds=train_seconds, samples=samples)

