"""The training loop: one loop for every layout.

Per optimizer step: `gradient_accumulation_steps` micro-batches under autocast; each micro-batch's
summed token loss is divided by the number of target tokens of the whole optimizer step (so the
update equals one big batch's mean-over-tokens loss, not a mean of micro-batch means); gradient
clipping by global norm (after unscaling under fp16); optimizer and LR step; metrics; periodic
evaluation, early stopping and atomic checkpoints (also on SIGINT/SIGTERM).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
import yaml

import gptforge
from gptforge.config import ModelConfig, RunConfig, to_dict
from gptforge.data.loader import TokenStream, TrainBatches, eval_windows
from gptforge.model.gpt import GPT, flops_per_token
from gptforge.train import checkpoint as ckpt_lib
from gptforge.train.loggers import MetricsWriter, Progress
from gptforge.train.mfu import device_peak
from gptforge.train.optim import build_optimizer, lr_at
from gptforge.train.parallelize import apply_activation_checkpointing, apply_compile

IGNORE_INDEX = -100

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def pick_device(name: str) -> torch.device:
    """`auto` -> CUDA if available, then MPS, then CPU; otherwise torch.device(name).

    Raises:
        ValueError: an unavailable device was asked for.
    """
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"train.device={name!r} but CUDA is not available here; use auto or cpu")
    return dev


def autocast_context(device: torch.device, precision: str):
    """torch.autocast for bf16/fp16, a no-op for fp32.

    Raises:
        ValueError: fp8 (planner-only) or bf16 on a CUDA GPU without bf16 support.
    """
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision not in AUTOCAST_DTYPES:
        raise ValueError(f"train.precision={precision!r} is not trainable here; use fp32, bf16 or fp16")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError("train.precision=bf16 but this GPU has no bf16 support; use fp16")
    return torch.autocast(device_type=device.type, dtype=AUTOCAST_DTYPES[precision])


def token_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed next-token cross-entropy in nats over targets != -100, computed in fp32.

    logits: (B, T, V); targets: (B, T) int64. Returns a 0-dim fp32 tensor.
    """
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="sum")


def count_targets(micro_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
    """Number of target tokens that count (!= -100) over all micro-batches of one optimizer step."""
    return sum(int((y != IGNORE_INDEX).sum()) for _, y in micro_batches)


def forward_backward(model: torch.nn.Module, micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
                     loss_divisor: float, device: torch.device, precision: str = "fp32",
                     scaler: torch.amp.GradScaler | None = None) -> torch.Tensor:
    """Accumulate gradients of sum(token losses) / loss_divisor over the micro-batches.

    With loss_divisor = the step's total target-token count, the accumulated gradient equals that
    of the mean token loss of one batch holding all micro-batches, however the target tokens are
    spread across micro-batches (a mean of micro-batch means would weight them unequally).
    Each micro-batch is (inputs (b, T), targets (b, T)) int64; targets -100 are ignored.

    Returns: the summed token loss in nats (0-dim, detached), for logging.
    """
    loss_sum = torch.zeros((), device=device)
    for x, y in micro_batches:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast_context(device, precision):
            logits = model(x)
        ls = token_loss_sum(logits, y)
        scaled = ls / max(loss_divisor, 1)
        (scaler.scale(scaled) if scaler is not None else scaled).backward()
        loss_sum += ls.detach()
    return loss_sum


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def git_commit() -> str | None:
    """The git commit of the gptforge checkout this runs from, or None when installed as a wheel."""
    here = Path(gptforge.__file__).resolve().parent.parent
    if not (here / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def run_config_yaml(cfg: RunConfig, data_dir: Path, extra: dict[str, Any] | None = None) -> str:
    """The resolved config plus provenance: versions, git commit, data path and meta.json hash."""
    doc = to_dict(cfg)
    doc["data"] = {"path": str(data_dir), "meta_sha256": file_sha256(Path(data_dir) / "meta.json")}
    doc["versions"] = {"gptforge": gptforge.__version__, "torch": str(torch.__version__), "git_commit": git_commit()}
    if extra:
        doc.update(extra)
    return yaml.safe_dump(doc, sort_keys=False)


@dataclass
class TrainResult:
    """What a finished (or stopped) run reports."""

    run_dir: Path
    step: int
    train_loss: float | None
    val_loss: float | None
    best_val_loss: float | None
    stopped: str
    tokens_seen: int
    history: list[dict] = field(default_factory=list)


class _StopFlag:
    """Set by SIGINT/SIGTERM; the loop checkpoints after the current step and exits."""

    def __init__(self):
        self.signal: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self):
        for s in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[s] = signal.signal(s, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum, frame):
        if self.signal is not None:  # second signal: give up at once
            raise KeyboardInterrupt
        self.signal = signum

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)


@torch.no_grad()
def evaluate_windows(model: torch.nn.Module, stream: TokenStream, offsets: np.ndarray, block_size: int,
                     batch_size: int, device: torch.device, precision: str) -> float:
    """Mean next-token loss (nats/token) over fixed windows, in eval mode."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(offsets), batch_size):
        rows = np.stack([stream.read(int(o), block_size + 1) for o in offsets[i : i + batch_size]])
        t = torch.from_numpy(rows).to(device)
        with autocast_context(device, precision):
            logits = model(t[:, :-1])
        total += float(token_loss_sum(logits, t[:, 1:]))
        count += t[:, 1:].numel()
    model.train(was_training)
    return total / count


def train(cfg: RunConfig, data_dir: str | Path, run_dir: str | Path, resume: bool = False,
          progress: bool = True, log: Callable[[str], None] | None = None) -> TrainResult:
    """Pretrain a GPT on the token shards in `data_dir`, writing the run to `run_dir`.

    Args:
        cfg: model/train/parallel config; `model.vocab_size` defaults to the data's vocabulary.
        data_dir: a `gptforge prepare` output folder (meta.json + *.bin + tokenizer.json).
        run_dir: output folder (config.yaml, metrics.jsonl, tb/, checkpoints/).
        resume: continue from run_dir/checkpoints/latest (same config).

    Returns: a TrainResult with the final step and losses.

    Raises:
        FileNotFoundError: missing data, or --resume without a complete checkpoint.
        ValueError: inconsistent config (e.g. vocab smaller than the data's, block_size too long
            for the data).
        RuntimeError: too many consecutive non-finite steps (the last good checkpoint is kept).
    """
    from gptforge.data.shards import load_meta

    data_dir, run_dir = Path(data_dir), Path(run_dir)
    tc, mc_in = cfg.train, cfg.model
    meta = load_meta(data_dir)
    if tc.num_threads:
        torch.set_num_threads(tc.num_threads)
    device = pick_device(tc.device)
    peak = device_peak(device, tc.precision)  # before seeding: measuring uses the RNG

    if mc_in.vocab_size is None:
        mc_in = ModelConfig(**{**to_dict(mc_in), "vocab_size": int(meta["vocab_size"])})
    mc = mc_in.resolved()
    if mc.vocab_size < int(meta["vocab_size"]):
        raise ValueError(
            f"model.vocab_size={mc.vocab_size} is smaller than the data's vocabulary ({meta['vocab_size']}, "
            f"{data_dir / 'meta.json'}); leave model.vocab_size unset to take it from the data"
        )
    cfg = RunConfig(model=mc, train=tc, parallel=cfg.parallel)

    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt_root = run_dir / "checkpoints"
    config_yaml = run_config_yaml(cfg, data_dir)

    torch.manual_seed(tc.seed)
    model = GPT(mc).to(device)
    n_params = model.num_params()
    apply_activation_checkpointing(model, tc.activation_checkpointing)
    if tc.compile:
        apply_compile(model)
    model.train()
    optimizer = build_optimizer(model, tc, device.type)
    scaler = torch.amp.GradScaler(device.type) if tc.precision == "fp16" else None

    split = meta["splits"]["train"]
    train_stream = TokenStream([data_dir / f for f in split["files"]], meta["dtype"])
    batches = TrainBatches(train_stream, mc.block_size, tc.micro_batch_size, tc.gradient_accumulation_steps, tc.seed)
    val_stream, val_offsets = None, None
    val_split = meta["splits"].get("val")
    if tc.eval_interval > 0 and val_split and val_split.get("tokens", 0) > mc.block_size + 1:
        val_stream = TokenStream([data_dir / f for f in val_split["files"]], meta["dtype"])
        val_offsets = eval_windows(val_stream, mc.block_size, tc.eval_steps * tc.micro_batch_size)

    state: dict[str, Any] = {"step": 0, "tokens_seen": 0, "best_val_loss": None, "evals_since_best": 0,
                             "elapsed_seconds": 0.0}
    if resume:
        found = ckpt_lib.find_checkpoint(run_dir)
        saved = yaml.safe_load((found / "config.yaml").read_text())
        if saved.get("model") != to_dict(mc):
            raise ValueError(f"--resume: the model config differs from the checkpoint's ({found / 'config.yaml'})")
        state.update(ckpt_lib.load_checkpoint(found, model, optimizer))
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
    ckpt_lib.atomic_write_text(run_dir / "config.yaml", config_yaml)
    if (data_dir / "tokenizer.json").exists():  # a run directory is self-contained for inference
        shutil.copyfile(data_dir / "tokenizer.json", run_dir / "tokenizer.json")

    say = log or (lambda m: None)
    tokens_per_step = batches.global_batch_size * mc.block_size
    fpt = flops_per_token(mc, n_params, mc.block_size)
    say(f"model: {mc.arch}, {n_params:,} parameters, {mc.n_layer} layers, d_model {mc.d_model}, "
        f"block_size {mc.block_size}, vocab {mc.vocab_size}")
    say(f"data: {split['tokens']:,} train tokens; {tokens_per_step:,} tokens per step; device {device}; "
        f"precision {tc.precision}; MFU against {peak.label}"
        + (f" ({peak.flops_per_second / 1e9:,.0f} GFLOP/s)" if peak.flops_per_second else ""))

    writer = MetricsWriter(run_dir, tensorboard=tc.tensorboard, resume_step=state["step"] if resume else None)
    bar = Progress(tc.max_steps, state["step"], enabled=progress)
    history: list[dict] = []
    params = [p for p in model.parameters() if p.requires_grad]
    stopped, bad_in_row, last_loss, last_val = "max_steps", 0, None, None
    start_step = state["step"]

    def save(step: int, best: bool = False) -> None:
        st = dict(state, scaler=scaler.state_dict() if scaler is not None else None,
                  data={"seed": tc.seed, "step": step, "global_batch_size": batches.global_batch_size})
        ckpt_lib.save_checkpoint(ckpt_root, step, model, optimizer, st, config_yaml,
                                 keep=tc.keep_checkpoints, mark_best=best)

    try:
        with _StopFlag() as stop:
            for step in range(start_step, tc.max_steps):
                t0 = time.perf_counter()
                lr = lr_at(step, tc)
                for g in optimizer.param_groups:
                    g["lr"] = lr
                micro = batches.micro_batches(step)
                n_tokens = count_targets(micro)
                loss_sum = forward_backward(model, micro, n_tokens, device, tc.precision, scaler)
                if scaler is not None:
                    scaler.unscale_(optimizer)
                max_norm = tc.grad_clip if tc.grad_clip > 0 else float("inf")
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
                loss = float(loss_sum) / max(n_tokens, 1)
                finite = math.isfinite(loss) and math.isfinite(grad_norm)
                if scaler is not None:
                    scaler.step(optimizer)  # skips the step itself on inf/nan gradients
                    scaler.update()
                elif finite:
                    optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                dt = time.perf_counter() - t0
                done = step + 1
                state["step"] = done
                state["tokens_seen"] += tokens_per_step
                state["elapsed_seconds"] += dt
                # Under fp16 the scaler's own skipped steps are routine; only a bad loss counts there.
                bad = not math.isfinite(loss) if scaler is not None else not finite
                bad_in_row = bad_in_row + 1 if bad else 0
                state["skipped_steps"] = state.get("skipped_steps", 0) + int(not finite)
                tps = tokens_per_step / dt
                row: dict[str, Any] = {
                    "step": done, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                    "tokens_per_second": tps,
                    "mfu": tps * fpt / peak.flops_per_second if peak.flops_per_second else None,
                    "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
                    "tokens_seen": state["tokens_seen"], "step_seconds": dt,
                    "elapsed_seconds": state["elapsed_seconds"], "skipped": not finite,
                }
                last_loss = loss if math.isfinite(loss) else last_loss
                if bad_in_row >= tc.max_bad_steps:
                    writer.write(row)
                    stopped = "non_finite"
                    raise RuntimeError(
                        f"{bad_in_row} consecutive steps with a non-finite loss or gradient (step {done}); "
                        f"stopping. The last good checkpoint is kept in {ckpt_root}. Try a lower train.lr, "
                        "train.grad_clip, or bf16 instead of fp16."
                    )
                is_last = done == tc.max_steps
                new_best = False
                if val_stream is not None and (done % tc.eval_interval == 0 or is_last):
                    last_val = evaluate_windows(model, val_stream, val_offsets, mc.block_size,
                                                tc.micro_batch_size, device, tc.precision)
                    row["val_loss"] = last_val
                    if state["best_val_loss"] is None or last_val < state["best_val_loss"]:
                        state["best_val_loss"], state["evals_since_best"], new_best = last_val, 0, True
                    else:
                        state["evals_since_best"] += 1
                if done % tc.log_interval == 0 or is_last or "val_loss" in row:
                    writer.write(row)
                history.append(row)
                info = f"loss {loss:.4f} lr {lr:.2e} {tps:,.0f} tok/s"
                if row["mfu"] is not None:
                    info += f" mfu {100 * row['mfu']:.1f}%"
                if last_val is not None:
                    info += f" val {last_val:.4f}"
                bar.update(done, info)

                early = tc.patience > 0 and state["evals_since_best"] >= tc.patience
                interrupted = stop.signal is not None
                stop_here = tc.stop_at_step and done >= tc.stop_at_step
                periodic = tc.checkpoint_interval > 0 and done % tc.checkpoint_interval == 0
                if new_best or periodic or is_last or early or interrupted or stop_here:
                    save(done, best=new_best)
                if early:
                    stopped = "early_stopping"
                    bar.log(f"early stopping at step {done}: no val improvement in {tc.patience} evaluations")
                    break
                if interrupted:
                    stopped = "signal"
                    bar.log(f"signal {stop.signal} received: checkpoint written at step {done}; "
                            "continue with --resume")
                    break
                if stop_here:
                    stopped = "stop_at_step"
                    break
    finally:
        bar.close()
        writer.close()
        train_stream.close()
        if val_stream is not None:
            val_stream.close()
    return TrainResult(run_dir=run_dir, step=state["step"], train_loss=last_loss, val_loss=last_val,
                       best_val_loss=state["best_val_loss"], stopped=stopped,
                       tokens_seen=state["tokens_seen"], history=history)
