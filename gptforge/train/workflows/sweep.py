"""Scaling sweeps: a grid of small runs (model sizes x token counts) that fits a time budget.

`plan_sweep` measures the training step time of each model size on this machine (a few real
optimizer steps on random tokens), then lays out the grid: with token counts given, every
(size, tokens) pair, dropping the most expensive runs until the estimate fits the budget; without,
a ladder of 1x, 2x and 4x a base token count solved so that the whole grid fills the budget.
`run_sweep` trains each run with the normal trainer (`gptforge.train.run.train`) into
SWEEP_DIR/<run name>/, an ordinary run directory, then scores every validation token once
(`gptforge.eval.perplexity.evaluate_tokens`, disjoint windows) and writes the result to
<run>/final_eval.json, which `gptforge plan --fit` reads.

Resumable: SWEEP_DIR/sweep.json keeps the plan; a sweep started again with the same options
skips finished runs (final_eval.json present), resumes a run from its latest checkpoint, and
restarts a run that was killed before its first checkpoint.

Recipe family (same for every run, as a scaling fit needs): GPT-2 blocks, head width 16, cosine
schedule decaying over each run's own length (Hoffmann et al. 2022, section 3: a schedule longer
than the run overstates its loss), warm-up 5% of the steps, a checkpoint at half and at the end
of each run (so a killed run loses at most half of itself).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from gptforge.atomic import atomic_write_json
from gptforge.config import ModelConfig, ParallelConfig, RunConfig, TrainConfig
from gptforge.errors import InputError
from gptforge.runtime.host_memory import keep_freed_memory

HEAD_DIM = 16
TOKEN_LADDER = (1, 2, 4)
"""Token counts of each size, in multiples of the base count, when --tokens is not given."""
MIN_STEPS = 10
"""The shortest run a sweep plans: fewer steps give no usable loss."""
RUN_OVERHEAD_SECONDS = 3.0
"""Assumed fixed cost of one run (start-up, checkpoints, loading for the final evaluation)."""
STEP_OVERHEAD = 1.15
"""The trainer's step (data loading, logging, metrics) over the bare step that is measured."""


def parse_size(text: str) -> tuple[int, int]:
    """'4x128' -> (n_layer 4, d_model 128).

    Raises:
        InputError: not LAYERSxD_MODEL, or d_model not a multiple of the head width (16).
    """
    m = re.fullmatch(r"(\d+)x(\d+)", str(text).strip())
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < HEAD_DIM:
        raise InputError(f"--sizes: cannot read {text!r}; write LAYERSxD_MODEL, e.g. 2x64")
    n_layer, d_model = int(m.group(1)), int(m.group(2))
    if d_model % HEAD_DIM:
        raise InputError(f"--sizes {text}: d_model must be a multiple of {HEAD_DIM} (the head width)")
    return n_layer, d_model


@dataclass
class SweepRun:
    """One planned run."""

    name: str
    n_layer: int
    d_model: int
    tokens: int
    """Training tokens: max_steps * micro_batch_size * block_size."""
    max_steps: int
    est_seconds: float
    """Estimated wall time, training plus final evaluation plus overhead."""


@dataclass
class SweepPlan:
    """The grid and the figures it was planned from (seconds, tokens)."""

    runs: list[SweepRun]
    options: dict
    """What the plan depends on (a restarted sweep must match)."""
    step_seconds: dict
    """Measured seconds per optimizer step of each size ('LxD'), overhead factor included."""
    val_tokens: int
    budget_seconds: float
    est_seconds: float
    dropped: list[str] = field(default_factory=list)
    """Runs of the requested grid left out to fit the budget."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SweepPlan":
        d = dict(d)
        d["runs"] = [SweepRun(**r) for r in d["runs"]]
        return cls(**d)


def model_config(n_layer: int, d_model: int, block_size: int, vocab_size: int) -> ModelConfig:
    """The sweep's model of a size (GPT-2 blocks, head width 16, no dropout)."""
    return ModelConfig(arch="gpt2", n_layer=n_layer, d_model=d_model, n_head=d_model // HEAD_DIM,
                       block_size=block_size, vocab_size=vocab_size, dropout=0.0)


def train_config(max_steps: int, options: dict) -> TrainConfig:
    """The sweep's recipe for a run of `max_steps` steps (see the module docstring)."""
    return TrainConfig(
        max_steps=max_steps, micro_batch_size=options["micro_batch_size"], lr=options["lr"],
        min_lr=options["lr"] / 10, warmup_steps=max(1, max_steps // 20), lr_schedule="cosine",
        eval_interval=max_steps, eval_steps=2, checkpoint_interval=max(1, max_steps // 2), keep_checkpoints=1,
        seed=options["seed"], device=options["device"], log_interval=max(1, max_steps // 20),
        tensorboard=False, report=False, wandb_project=None,
    )


def measure_step_seconds(mc: ModelConfig, tc: TrainConfig, device: torch.device, steps: int = 5) -> float:
    """Median wall seconds of one training step of `GPT(mc)` as the trainer runs it (its
    forward_backward, gradient clipping and optimizer from `build_optimizer`) on random tokens of
    shape (tc.micro_batch_size, block_size), after two warm-up steps. On a CPU glibc's allocator policy
    is set first, as each run's training sets it (`gptforge.runtime.host_memory.keep_freed_memory`)."""
    from gptforge.model.gpt import GPT
    from gptforge.train.optim import build_optimizer
    from gptforge.train.step import forward_backward, onednn_linear_for

    keep_freed_memory(device_type=device.type)  # as gptforge.train.run.train does before the first step
    torch.manual_seed(0)
    model = GPT(mc.resolved()).to(device)
    opt = build_optimizer(model, tc, device.type)
    x = torch.randint(0, mc.vocab_size, (tc.micro_batch_size, mc.block_size + 1))
    micro = [(x[:, :-1], x[:, 1:])]
    times = []
    for i in range(steps + 2):
        t0 = time.perf_counter()
        forward_backward(model, micro, float(x[:, 1:].numel()), device,
                         use_onednn_linear=onednn_linear_for(tc.onednn_linear, device, "fp32", False))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def plan_sweep(data_dir: str | Path, budget_seconds: float, sizes: list[str], tokens: list[float] | None = None,
               block_size: int = 64, micro_batch_size: int = 16, lr: float = 2e-3, seed: int = 1337,
               device: str = "auto", log: Callable[[str], None] | None = None) -> SweepPlan:
    """Plan a grid of runs that fits `budget_seconds` on this machine (see the module docstring).

    Raises:
        InputError: bad sizes, fewer than 2 sizes, a budget too small for 5 runs of MIN_STEPS steps.
        FileNotFoundError / ValueError: not a shard folder (gptforge.data.shards.load_meta).
    """
    from gptforge.data.shards import load_meta
    from gptforge.runtime.device import pick_device

    say = log or (lambda m: None)
    meta = load_meta(data_dir)
    shapes = [parse_size(s) for s in sizes]
    if len(set(shapes)) < 2:
        raise InputError("--sizes: a scaling sweep needs at least 2 model sizes")
    options = {"sizes": [f"{a}x{b}" for a, b in shapes], "tokens": None if tokens is None else [int(t) for t in tokens],
               "block_size": block_size, "micro_batch_size": micro_batch_size, "lr": lr, "seed": seed,
               "device": device, "budget_seconds": budget_seconds, "tokenizer_sha256": meta["tokenizer_sha256"]}
    dev = pick_device(device, "--device")
    vocab = int(meta["vocab_size"])
    val_tokens = int((meta["splits"].get("val") or {}).get("tokens") or 0)
    if val_tokens < 2:
        raise InputError(f"{Path(data_dir) / 'meta.json'}: no val split; prepare the data with a val fraction")
    tokens_per_step = micro_batch_size * block_size
    step_s: dict[str, float] = {}
    for n_layer, d_model in shapes:
        key = f"{n_layer}x{d_model}"
        step_s[key] = STEP_OVERHEAD * measure_step_seconds(model_config(n_layer, d_model, block_size, vocab),
                                                           train_config(100, options), dev)
        say(f"measured {key}: {step_s[key] * 1e3:.1f} ms per step of {tokens_per_step} tokens")
    # Scoring the val split: forward only, about a third of a training step per window of tokens.
    eval_s = {k: v / 3 * math.ceil(val_tokens / tokens_per_step) for k, v in step_s.items()}

    def cost(key: str, steps: int) -> float:
        return steps * step_s[key] + eval_s[key] + RUN_OVERHEAD_SECONDS

    runs: list[SweepRun] = []
    dropped: list[str] = []
    if tokens is None:
        fixed = sum(len(TOKEN_LADDER) * (eval_s[k] + RUN_OVERHEAD_SECONDS) for k in step_s)
        per_base_step = sum(step_s.values()) * sum(TOKEN_LADDER)
        base_steps = int((budget_seconds - fixed) / per_base_step)
        if base_steps < MIN_STEPS:
            need = fixed + MIN_STEPS * per_base_step
            raise InputError(f"--budget-minutes {budget_seconds / 60:g}: too small for {len(step_s)} sizes x "
                             f"{len(TOKEN_LADDER)} token counts of at least {MIN_STEPS} steps on this machine "
                             f"(needs about {need / 60:.1f} minutes); raise it or give fewer/smaller --sizes")
        grid = [(k, base_steps * r) for k in step_s for r in TOKEN_LADDER]
    else:
        grid = [(k, max(1, int(round(t / tokens_per_step)))) for k in step_s for t in tokens]
        short = [f"{k}/{s * tokens_per_step}" for k, s in grid if s < MIN_STEPS]
        if short:
            raise InputError(f"--tokens: runs of fewer than {MIN_STEPS} steps ({tokens_per_step} tokens each): "
                             f"{', '.join(short)}")
        grid.sort(key=lambda g: cost(*g))
        while grid and sum(cost(*g) for g in grid) > budget_seconds:
            k, s = grid.pop()
            dropped.append(f"{k}_t{s * tokens_per_step}")
        if len(grid) < 5:
            raise InputError(f"--budget-minutes {budget_seconds / 60:g}: only {len(grid)} of the requested runs fit "
                             "on this machine, and a fit needs 5; raise the budget or lower --tokens")
    for key, steps in sorted(grid, key=lambda g: cost(*g)):
        n_layer, d_model = parse_size(key)
        t = steps * tokens_per_step
        runs.append(SweepRun(name=f"l{n_layer}_d{d_model}_t{t}", n_layer=n_layer, d_model=d_model, tokens=t,
                             max_steps=steps, est_seconds=cost(key, steps)))
    return SweepPlan(runs=runs, options=options, step_seconds=step_s, val_tokens=val_tokens,
                     budget_seconds=budget_seconds, est_seconds=sum(r.est_seconds for r in runs), dropped=dropped)


def load_or_write_plan(out: Path, make_plan: Callable[[], SweepPlan], options: dict) -> tuple[SweepPlan, bool]:
    """The plan kept in out/sweep.json when its options equal `options` (a resumed sweep), else a
    new plan written there. Returns (plan, resumed).

    Raises:
        InputError: out/sweep.json holds a sweep with other options.
    """
    path = out / "sweep.json"
    if path.is_file():
        saved = SweepPlan.from_dict(json.loads(path.read_text())["plan"])
        mine = {k: v for k, v in saved.options.items() if k in options}
        if mine != options:
            diff = ", ".join(f"{k}: {mine.get(k)!r} there, {v!r} now" for k, v in options.items() if mine.get(k) != v)
            raise InputError(f"{path} holds a sweep with other options ({diff}); continue it with the same options "
                             "or give a new --out")
        return saved, True
    plan = make_plan()
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"plan": plan.to_dict()})
    return plan, False


def evaluate_val_split(run_dir: Path, data_dir: Path, device: torch.device, batch_size: int = 16) -> dict:
    """Loss over every token of the val split (disjoint windows of block_size) of the run's latest
    checkpoint: {'val_loss' (nats/token), 'val_tokens', 'bits_per_byte'}."""
    from gptforge.data.loader import TokenStream
    from gptforge.data.shards import load_meta
    from gptforge.eval.perplexity import evaluate_tokens
    from gptforge.runtime.loading import load_for_inference

    meta = load_meta(data_dir)
    split = meta["splits"]["val"]
    stream = TokenStream([Path(data_dir) / f for f in split["files"]], meta["dtype"])
    try:
        toks = stream.read(0, stream.num_tokens)
    finally:
        stream.close()
    model, _ckpt, _doc, _tok = load_for_inference(run_dir, device)
    r = evaluate_tokens(model, toks, n_bytes=split.get("bytes"), stride=model.config.block_size,
                        batch_size=batch_size, device=device)
    return {"val_loss": r.loss, "val_tokens": r.tokens, "bits_per_byte": r.bits_per_byte}


def run_sweep(plan: SweepPlan, data_dir: str | Path, out: str | Path,
              log: Callable[[str], None] | None = None) -> dict:
    """Train and score every run of `plan` not yet finished (see the module docstring).

    Returns: {'finished': [run names], 'stopped': run name or None (a signal stopped it: start the
    sweep again to continue), 'seconds': wall time of this call}.

    Raises:
        InputError / FileNotFoundError: from the trainer (bad data).
    """
    from gptforge.errors import TrainingError
    from gptforge.plan.fit import RESULT_FILE, non_embedding_params
    from gptforge.runtime.device import pick_device
    from gptforge.train.run import train

    say = log or (lambda m: None)
    out, data_dir = Path(out), Path(data_dir)
    opts = plan.options
    device = pick_device(opts["device"], "--device")
    vocab = None
    t_start = time.perf_counter()
    finished = []
    for i, r in enumerate(plan.runs, 1):
        run_dir = out / r.name
        if (run_dir / RESULT_FILE).is_file():
            finished.append(r.name)
            continue
        resume = (run_dir / "checkpoints" / "latest").is_file()
        if run_dir.exists() and not resume:
            shutil.rmtree(run_dir)  # killed before its first checkpoint: nothing to keep
        if vocab is None:
            from gptforge.data.shards import load_meta

            vocab = int(load_meta(data_dir)["vocab_size"])
        mc = model_config(r.n_layer, r.d_model, opts["block_size"], vocab)
        cfg = RunConfig(model=mc, train=train_config(r.max_steps, opts), parallel=ParallelConfig())
        say(f"[{i}/{len(plan.runs)}] {r.name}: {r.max_steps} steps, {r.tokens:,} tokens"
            + (" (resumed)" if resume else "") + f", ~{r.est_seconds:.0f} s")
        t0 = time.perf_counter()
        try:
            result = train(cfg, data_dir, run_dir, resume=resume, progress=False)
        except TrainingError as e:
            say(f"  {r.name} diverged: {e}")
            atomic_write_json(run_dir / RESULT_FILE, {"val_loss": float("nan"), "tokens": r.tokens,
                                                      "stopped": "non_finite", "step": None})
            continue
        if result.stopped == "signal":
            say(f"  {r.name} stopped by a signal at step {result.step}: run the same sweep command to continue")
            return {"finished": finished, "stopped": r.name, "seconds": time.perf_counter() - t_start}
        ev = evaluate_val_split(run_dir, data_dir, device)
        atomic_write_json(run_dir / RESULT_FILE, {
            **ev, "tokens": result.tokens_seen, "step": result.step, "stopped": result.stopped,
            "n_params_non_embedding": non_embedding_params(mc), "seconds": time.perf_counter() - t0,
            "est_seconds": r.est_seconds})
        finished.append(r.name)
        say(f"  val loss {ev['val_loss']:.4f} over {ev['val_tokens']:,} val tokens "
            f"({time.perf_counter() - t0:.1f} s, estimated {r.est_seconds:.1f} s)")
    return {"finished": finished, "stopped": None, "seconds": time.perf_counter() - t_start}
