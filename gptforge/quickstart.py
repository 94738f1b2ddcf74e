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
from typing import TYPE_CHECKING, Callable

import torch

from gptforge.config import ModelConfig, OptimizerName, RunConfig, TrainConfig, check_preset
from gptforge.errors import InputError, OptionError

if TYPE_CHECKING:
    import numpy as np

    from gptforge.model.gpt import GPT


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


VAL_FILES = 4
"""Files the quickstart's val split holds at least (when the corpus has enough of them)."""

SHORT_VAL_ADVICE = ("Give the quickstart more library files (a larger --max-files, or leave it out for the whole "
                    "library), or a smaller --block-size.")
"""The fix the trainer's warning names when the quickstart's val split is shorter than one window
(gptforge.train.sources.ShardSource: its default names `gptforge prepare` options, which the
quickstart does not take)."""

SHORT_TRAIN_ADVICE = ("give the quickstart more library files (a larger --max-files, or leave it out for the whole "
                      "library), or a smaller --block-size")
"""The fix the error names when the quickstart's train split is shorter than one window."""

FEW_FILES_ADVICE = ("give the quickstart more library files (a larger --max-files, or leave it out for the whole "
                    "library; each file is one document), for a split by document")
"""The fix prepare's warning names when the quickstart's corpus has too few files for a split by document
(gptforge.data.prepare.prepare: its default names `gptforge prepare`'s --doc-separator)."""

EVAL_STEPS = 8

QUICKSTART_OPTIMIZERS = ("muon", "adamw")
"""The optimizers the quickstart's recipe is tuned for (--optimizer; its --help names these)."""
"""Validation batches of --micro-batch-size windows at each of the quickstart's evaluations."""


def run_quickstart(out: Path, minutes: float = 10.0, vocab_size: int = 4096, preset: str = "qwen3-micro",
                   micro_batch_size: int = 16, block_size: int = 256, max_files: int | None = None,
                   workers: int = 0, steps: int | None = None, progress: bool = True,
                   log: Callable[[str], None] = print, optimizer: OptimizerName = "muon") -> QuickstartResult:
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

    A rerun with the same `out` replaces the previous quickstart run in `out/run` (and `out/data`
    when the corpus options changed); folders there that the quickstart did not write (no
    `MARKER` file in `out`) are never replaced.

    Raises:
        FileNotFoundError: this Python ships no standard-library sources.
        InputError: `out/run` or `out/data` exists but was not written by a quickstart, or the
            prepared train split holds fewer tokens than one window (block_size + 1).
        ValueError: an unknown preset (naming --preset) or a bad shape (before anything is prepared).
        InputError (also before): an optimizer other than QUICKSTART_OPTIMIZERS.
    """
    from gptforge.runtime.checkpoint import find_checkpoint
    from gptforge.runtime.loading import load_for_inference

    out = Path(out)
    data_dir, run_dir = out / "data", out / "run"
    check_preset(preset, "--preset")  # named as the quickstart's option, before anything is prepared
    ModelConfig(preset=preset, block_size=block_size, vocab_size=vocab_size).resolved()  # a bad shape fails first
    if optimizer not in QUICKSTART_OPTIMIZERS:
        raise OptionError(f"--optimizer {optimizer!r}: the quickstart trains with {' or '.join(QUICKSTART_OPTIMIZERS)}")
    _claim_folder(out, log)
    meta = _prepare_corpus(data_dir, _library_files(max_files), vocab_size, workers, progress, log)
    model_cfg = ModelConfig(preset=preset, block_size=block_size, vocab_size=meta["vocab_size"])
    source = _open_source(data_dir, micro_batch_size, log)
    source.check_window(block_size)  # before any step is timed on a shape the data cannot fill
    tc = _plan_steps(model_cfg, minutes, steps, micro_batch_size, optimizer, log)
    if run_dir.exists():  # the quickstart's own folder (`_claim_folder` checked): a rerun starts a fresh run
        log(f"      deleting the previous quickstart run in {run_dir} (its trained model and metrics)")
        shutil.rmtree(run_dir)
    step, train_seconds = _train(RunConfig(model=model_cfg, train=tc), source, run_dir, progress, log)

    log("[3/4] evaluating on the whole val split")
    model, ckpt, _doc, tok_path = load_for_inference(run_dir, "cpu")
    val_loss, val_bits_per_byte, h1 = _evaluate(model, data_dir, meta, progress, log)
    samples = _samples(model, tok_path, log)
    log(f"\nrun directory: {run_dir}\n  checkpoint:  {find_checkpoint(run_dir)}\n"
        f"  metrics:     {run_dir / 'metrics.jsonl'}\n  TensorBoard: tensorboard --logdir {run_dir / 'tb'}\n"
        f"next: gptforge generate {run_dir} --prompt 'def '   |   gptforge evaluate {run_dir} --data {data_dir}")
    return QuickstartResult(data_dir=data_dir, run_dir=run_dir, checkpoint=ckpt, val_loss=val_loss,
                            val_bits_per_byte=val_bits_per_byte, unigram_entropy=h1, steps=step,
                            train_seconds=train_seconds, samples=samples)


MARKER = ".gptforge-quickstart"
"""File in the quickstart's --out folder saying that its data/ and run/ are the quickstart's own."""


def _claim_folder(out: Path, log: Callable[[str], None]) -> None:
    """Check that `out/data` and `out/run` are absent or the quickstart's own (`MARKER` in `out`),
    say that a rerun replaces the previous run, then write the marker.

    Raises:
        InputError: `out` is a file, or `out/data` or `out/run` exists without the marker (the message
            says what to do).
    """
    from gptforge.atomic import atomic_write_text

    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file: the quickstart writes a folder there; choose another --out")
    own = (out / MARKER).is_file()
    for folder in (out / "data", out / "run"):
        if folder.exists() and not own:
            raise InputError(f"{folder} exists and was not written by gptforge quickstart (no {out / MARKER}); "
                             f"the quickstart would replace it: move it away or choose another --out")
    if own and (out / "run").exists():
        log(f"note: this rerun replaces the previous quickstart run in {out / 'run'} (trained model included); "
            f"copy it elsewhere first to keep it, or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / MARKER, "data/ and run/ in this folder were written by gptforge quickstart, "
                                    "which replaces them on a rerun.\n")


def _library_files(max_files: int | None) -> list[Path]:
    """The standard library's source files, or `max_files` of them spread evenly over the list.

    Raises:
        FileNotFoundError: this Python ships no standard-library sources.
    """
    from gptforge.data.stdlib_corpus import stdlib_files

    files = stdlib_files()
    if max_files:
        files = files[:: max(1, len(files) // max_files)][:max_files]
    return files


def _prepare_corpus(data_dir: Path, files: list[Path], vocab_size: int, workers: int, progress: bool,
                    log: Callable[[str], None]) -> dict:
    """Step 1: tokenize `files` into shards in `data_dir`, or reuse the shards already there when they
    were prepared from the same files with the same vocabulary. Returns the shards' meta.json."""
    from gptforge.data.prepare import PrepareConfig, prepare
    from gptforge.data.shards import load_meta

    inputs = [str(f) for f in files]
    old = load_meta(data_dir) if (data_dir / "meta.json").exists() else None
    if old and old["vocab_size"] == vocab_size and old.get("prepare_config", {}).get("inputs") == inputs:
        log(f"[1/4] reusing the prepared corpus in {data_dir} (same files and vocabulary)")
    else:
        log(f"[1/4] preparing {len(files)} standard-library source files -> {data_dir}")
        # 2% of the library's ~700 files; a few files at least when --max-files keeps the corpus small,
        # so the val loss and its comparison with the unigram entropy rest on more than one file.
        val_fraction = min(0.2, max(0.02, VAL_FILES / len(files)))
        prepare(PrepareConfig(inputs=inputs, out=str(data_dir), vocab_size=vocab_size,
                              val_fraction=val_fraction, seed=1337, workers=workers, overwrite=True, recipe="code"),
                show_progress=progress, few_documents_advice=FEW_FILES_ADVICE)
    return load_meta(data_dir)


def _fastest_threads(model_cfg: ModelConfig, probe: TrainConfig) -> tuple[int, float]:
    """Time one optimizer step with all of torch's threads and with one, keep the faster (a busy
    machine can make all-core OpenMP slower than one thread). Leaves torch set to it and returns
    (threads, seconds per step)."""
    from gptforge.train.budget import measure_step_seconds

    timings = {}
    for threads in dict.fromkeys([torch.get_num_threads(), 1]):
        torch.set_num_threads(threads)
        timings[threads] = measure_step_seconds(model_cfg, probe)
    threads = min(timings, key=timings.__getitem__)
    torch.set_num_threads(threads)
    return threads, timings[threads]


THREADS_PROBE_MIN_STEPS = 100
"""With --steps, the fewest steps for which the threads probe still runs (`_fastest_threads`: about 8
steps' time, under a tenth of the training from here on); a shorter run keeps torch's threads untimed."""


def _plan_steps(model_cfg: ModelConfig, minutes: float, steps: int | None, micro_batch_size: int,
                optimizer: OptimizerName, log: Callable[[str], None]) -> TrainConfig:
    """Step 2's plan: the training config whose step count (`steps`, or as many as a measured step
    time fits in `minutes`) lets the learning-rate schedule finish inside the budget. With `steps`
    nothing needs the step time: the threads probe runs only for THREADS_PROBE_MIN_STEPS steps or more."""
    from gptforge.train.budget import steps_for_minutes
    from gptforge.train.optim import resolve_lr_defaults

    step_s: float | None = None
    if steps is not None and steps < THREADS_PROBE_MIN_STEPS:
        threads, max_steps = torch.get_num_threads(), steps
    else:
        # The timing probe's optimizer runs at the run's own size-aware lr (the lr does not change the timing).
        probe = resolve_lr_defaults(model_cfg, TrainConfig(micro_batch_size=micro_batch_size, optimizer=optimizer))
        threads, step_s = _fastest_threads(model_cfg, probe)
        # Evaluations take ~10% of the budget; the rest is optimizer steps.
        max_steps = steps or steps_for_minutes(minutes, step_s)
    # lr, min_lr, warmup and muon_lr unset: the size-aware defaults (printed at the start of training).
    tc = TrainConfig(max_steps=max_steps, micro_batch_size=micro_batch_size, optimizer=optimizer,
                     weight_decay=0.1, eval_interval=max(10, max_steps // 10),
                     eval_steps=EVAL_STEPS, checkpoint_interval=max(50, max_steps // 4), seed=1337, num_threads=threads)
    timing = (f"{step_s:.3f} s/step measured with {threads} thread(s), about {max_steps * step_s / 60:.1f} min"
              if step_s is not None else f"{threads} thread(s), no timing probe for a short --steps run")
    log(f"[2/4] training {model_cfg.preset} with {optimizer} (block_size {model_cfg.block_size}, "
        f"batch {micro_batch_size}) for {max_steps} steps: {timing}")
    return tc


def _open_source(data_dir: Path, micro_batch_size: int, log: Callable[[str], None]):
    """The trainer's source on the quickstart's shards (gptforge.train.sources.ShardSource): its messages
    about a split shorter than one window, or a val split holding fewer windows than asked, name the
    quickstart's own options (SHORT_VAL_ADVICE, SHORT_TRAIN_ADVICE), not `gptforge prepare`'s."""
    from gptforge.train.sources import ShardSource

    return ShardSource(data_dir, eval_steps=EVAL_STEPS, micro_batch_size=micro_batch_size, log=log,
                       short_val_advice=SHORT_VAL_ADVICE, short_train_advice=SHORT_TRAIN_ADVICE,
                       eval_windows_origin=f"{EVAL_STEPS} evaluation batches x --micro-batch-size")


def _train(run: RunConfig, source, run_dir: Path, progress: bool, log: Callable[[str], None]) -> tuple[int, float]:
    """Step 2: train `run` on `source` (`_open_source`); returns (the last step, wall-clock seconds of training)."""
    from gptforge.train.run import train

    t0 = time.perf_counter()
    result = train(run, source.data_dir, run_dir, progress=progress, log=log, data=source)
    return result.step, time.perf_counter() - t0


def _read_split(data_dir: Path, meta: dict, split: str) -> np.ndarray:
    """Every token of one split of the shards in `data_dir`, in order."""
    from gptforge.data.loader import TokenStream

    stream = TokenStream([data_dir / f for f in meta["splits"][split]["files"]], meta["dtype"])
    tokens = stream.read(0, stream.num_tokens)
    stream.close()
    return tokens


def _evaluate(model: GPT, data_dir: Path, meta: dict, progress: bool,
              log: Callable[[str], None]) -> tuple[float, float | None, float]:
    """Step 3: loss and bits per byte on the whole val split, beside the unigram entropy (a model of
    the train split's token frequencies alone). Returns (loss in nats/token, bits/byte, entropy)."""
    from gptforge.eval.perplexity import evaluate_tokens, unigram_entropy

    val_tokens = _read_split(data_dir, meta, "val")
    ev = evaluate_tokens(model, val_tokens, n_bytes=meta["splits"]["val"]["bytes"], progress=progress)
    train_tokens = _read_split(data_dir, meta, "train")
    h1 = unigram_entropy(val_tokens[1:], meta["vocab_size"], reference=train_tokens)
    log(f"      val loss {ev.loss:.3f} nats/token (perplexity {ev.perplexity:.1f}, {ev.bits_per_byte:.3f} bits/byte) "
        f"vs unigram entropy {h1:.3f} nats/token (a model of token frequencies alone)")
    return ev.loss, ev.bits_per_byte, h1


def _samples(model: GPT, tok_path: Path, log: Callable[[str], None]) -> list[str]:
    """Step 4: 80 sampled tokens after each of three code prompts (temperature 0.8, top-k 50, seeded)."""
    from gptforge.data.tokenizer import Tokenizer
    from gptforge.infer.generate import generate

    log("[4/4] samples (temperature 0.8, top-k 50):")
    tok = Tokenizer.from_file(tok_path)
    samples = []
    for i, prompt in enumerate(["def ", "class ", '"""Return the ']):
        ids = torch.tensor([tok.encode(prompt)])
        outp = generate(model, ids, 80, temperature=0.8, top_k=50, seed=i)
        text = prompt + tok.decode(outp[0, ids.size(1):].tolist())
        samples.append(text)
        log(f"--- prompt {prompt!r}\n{text}")
    return samples
