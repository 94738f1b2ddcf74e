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
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import yaml

import gptforge
from gptforge.config import ModelConfig, RunConfig, to_dict
from gptforge.data.loader import TokenStream, TrainBatches, eval_windows
from gptforge.eval.perplexity import evaluate_windows
from gptforge.model.gpt import GPT, flops_per_token
from gptforge.runtime import checkpoint as ckpt_lib
from gptforge.runtime.activation import apply_activation_checkpointing
from gptforge.runtime.device import autocast_context, pick_device
from gptforge.runtime.loss import (
    IGNORE_INDEX,
    count_targets,
    token_loss_sum,
    unpack_micro_batch,
)
from gptforge.train import distributed as D
from gptforge.train.backend import DeepSpeedBackend, TorchBackend
from gptforge.train.loggers import MetricsWriter, Progress
from gptforge.train.mfu import Peak, device_peak
from gptforge.train.optim import build_optimizer, lr_at
from gptforge.train.parallelize import Parallelized, apply_compile, parallelize


def forward_backward(model: torch.nn.Module, micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
                     loss_divisor: float, device: torch.device, precision: str = "fp32",
                     scaler: torch.amp.GradScaler | None = None,
                     grad_sync: Callable[[bool], Any] | None = None,
                     backward: Callable[[torch.Tensor, bool], None] | None = None) -> torch.Tensor:
    """Accumulate gradients of sum(token losses) / loss_divisor over the micro-batches.

    With loss_divisor = the step's total target-token count, the accumulated gradient equals that
    of the mean token loss of one batch holding all micro-batches, however the target tokens are
    spread across micro-batches (a mean of micro-batch means would weight them unequally).
    Each micro-batch is (inputs (b, T), targets (b, T)) int64, or a dict (see
    `unpack_micro_batch`); targets -100 are ignored.

    Data parallel: pass loss_divisor = (global target count over all dp ranks) / dp, because DDP
    and FSDP2 average gradients over the dp ranks; `grad_sync(is_last)` gives the context of each
    backward (gradients are reduced across ranks on the last micro-batch only).
    `backward(loss, is_last)` replaces `loss.backward()` (a backend's, e.g. DeepSpeed's engine).

    Returns: this rank's summed token loss in nats (0-dim, detached), for logging.
    """
    loss_sum = torch.zeros((), device=device)
    n = len(micro_batches)
    for i, mb in enumerate(micro_batches):
        x, y, extra = unpack_micro_batch(mb)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        extra = {k: v.to(device, non_blocking=True) for k, v in extra.items()}
        with grad_sync(i == n - 1) if grad_sync is not None else contextlib.nullcontext():
            with autocast_context(device, precision):
                logits = model(x, **extra)
            ls = token_loss_sum(logits, y)
            scaled = ls / max(loss_divisor, 1e-12) if loss_divisor > 0 else ls
            if backward is not None:
                backward(scaled, i == n - 1)
            else:
                (scaler.scale(scaled) if scaler is not None else scaled).backward()
        loss_sum += ls.detach()
    return loss_sum


class PipelineLoss:
    """loss_fn of the last pipeline stage: summed token loss of a micro-batch / `divisor`.

    The divisor is the step's global target count (over dp ranks, / dp), so the schedule runs
    with scale_grads=False: dividing again by the micro-batch count would be wrong whenever
    micro-batches hold different numbers of target tokens. The raw sums are kept in `sums`.
    """

    def __init__(self):
        self.divisor = 1.0
        self.sums: list[torch.Tensor] = []

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        ls = token_loss_sum(logits, targets)
        self.sums.append(ls.detach())
        return ls / self.divisor


def _pipeline_run(par: Parallelized, pp_loss: PipelineLoss, x: torch.Tensor, y: torch.Tensor,
                  device: torch.device, precision: str, train: bool) -> torch.Tensor:
    has_first = any(s.is_first for s in par.stages)
    has_last = any(s.is_last for s in par.stages)
    pp_loss.sums = []
    args = (x.to(device),) if has_first else ()
    kwargs: dict[str, Any] = {"target": y.to(device), "losses": []} if has_last else {}
    with autocast_context(device, precision):
        if train:
            par.schedule.step(*args, **kwargs)
        else:
            par.schedule.eval(*args, **kwargs)
    if pp_loss.sums:
        # The first step also calls loss_fn once on placeholder tensors to infer gradient shapes:
        # the real calls are the last n_microbatches.
        return torch.stack(pp_loss.sums[-par.n_microbatches:]).sum().to(device)
    return torch.zeros((), device=device)


def pipeline_forward_backward(par: Parallelized, pp_loss: PipelineLoss,
                              micro_batches: list[tuple[torch.Tensor, torch.Tensor]], loss_divisor: float,
                              device: torch.device, precision: str = "fp32") -> torch.Tensor:
    """One optimizer step's forward and backward through the pipeline schedule.

    The rank's micro-batches are concatenated into one (b * gradient_accumulation_steps, T) batch
    that the schedule cuts into `par.n_microbatches` pipeline micro-batches. Returns the summed
    token loss on the rank holding the last stage, 0 elsewhere.
    """
    x = torch.cat([m[0] for m in micro_batches])
    y = torch.cat([m[1] for m in micro_batches])
    pp_loss.divisor = loss_divisor
    return _pipeline_run(par, pp_loss, x, y, device, precision, train=True)


@torch.no_grad()
def pipeline_evaluate(par: Parallelized, pp_loss: PipelineLoss, stream: TokenStream, offsets: np.ndarray,
                      block_size: int, rows: int, device: torch.device, precision: str, env) -> float:
    """Mean next-token loss over fixed windows through the pipeline, in eval mode.

    Batches have `rows` windows (the training per-rank batch, so stage shapes match training); a
    short last batch is padded with ignored targets. The result is the same on every rank.
    """
    for m in par.stage_modules:
        m.eval()
    total, count = 0.0, 0
    pp_loss.divisor = 1.0
    for i in range(0, len(offsets), rows):
        chunk = [stream.read(int(o), block_size + 1) for o in offsets[i : i + rows]]
        real = len(chunk)
        chunk += [chunk[0]] * (rows - real)
        t = torch.from_numpy(np.stack(chunk))
        x, y = t[:, :-1].contiguous(), t[:, 1:].contiguous()
        y[real:] = IGNORE_INDEX
        total += float(_pipeline_run(par, pp_loss, x, y, device, precision, train=False))
        count += real * block_size
    for m in par.stage_modules:
        m.train()
    (total,) = env.all_reduce_sum([total], group=env.group("pp"))
    return total / count


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
    """The resolved config plus provenance: versions, git commit, data path and meta.json hash
    (for a data file such as an instruction .jsonl: the file's own hash)."""
    doc = to_dict(cfg)
    if Path(data_dir).is_file():
        doc["data"] = {"path": str(data_dir), "sha256": file_sha256(Path(data_dir))}
    else:
        meta_path = Path(data_dir) / "meta.json"
        doc["data"] = {"path": str(data_dir), "meta_sha256": file_sha256(meta_path),
                       "tokenizer_sha256": json.loads(meta_path.read_text()).get("tokenizer_sha256")}
    doc["versions"] = {"gptforge": gptforge.__version__, "torch": str(torch.__version__), "git_commit": git_commit()}
    if extra:
        doc.update(extra)
    return yaml.safe_dump(doc, sort_keys=False)


class _NullWriter:
    """Ranks other than 0 write no metrics."""

    def write(self, row: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


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
    signal: int | None = None
    """The signal (SIGINT 2, SIGTERM 15) that stopped the run, when one did."""

    def summary(self) -> str:
        """One line saying how the run ended."""
        if not self.history and self.stopped == "max_steps":
            return (f"nothing to do: {self.run_dir} is already at train.max_steps ({self.step}); "
                    "raise --train.max_steps to train further")
        val = f", val loss {self.val_loss:.4f}" if self.val_loss is not None else ""
        train_loss = f"{self.train_loss:.4f}" if self.train_loss is not None else "n/a"
        return (f"stopped ({self.stopped}) at step {self.step}: train loss {train_loss}{val}; "
                f"run directory {self.run_dir}")

    @property
    def exit_code(self) -> int:
        """128 + signal for a run stopped by SIGINT/SIGTERM (as a shell reports a killed program),
        so that schedulers can tell it from a finished run; 0 otherwise."""
        return 128 + int(self.signal) if self.signal else 0


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


def train(cfg: RunConfig, data_dir: str | Path, run_dir: str | Path, resume: bool = False,
          progress: bool = True, log: Callable[[str], None] | None = None, *,
          model_factory: Callable[[ModelConfig], torch.nn.Module] | None = None,
          data: Any = None, config_extra: dict[str, Any] | None = None,
          on_save: Callable[[int, Path], None] | None = None) -> TrainResult:
    """Pretrain a GPT on the token shards in `data_dir`, writing the run to `run_dir`.

    Args:
        cfg: model/train/parallel config; `model.vocab_size` defaults to the data's vocabulary.
        data_dir: a `gptforge prepare` output folder (meta.json + *.bin + tokenizer.json), or with
            `data`, the file that data came from (hashed into config.yaml).
        run_dir: output folder (config.yaml, metrics.jsonl, tb/, checkpoints/).
        resume: continue from run_dir/checkpoints/latest (same config).

    Hooks (fine-tuning, see gptforge.train.finetune):
        model_factory: builds the model from the resolved ModelConfig, called after seeding in
            place of `GPT(cfg)` (e.g. load pretrained weights, add LoRA adapters); only parameters
            with requires_grad are optimized.
        data: a batch source used instead of the shard folder, with attributes `vocab_size`,
            `description` (a log line), `has_val` and methods `batches(block_size, train_cfg, dp_rank,
            dp_size)` (an object with `micro_batches(step)`, `global_batch_size`, `tokens_per_step`
            and `seq_len`), `evaluate(model, device, precision)` (mean val loss, or None when
            it has no val set), `close()`.
        config_extra: extra top-level sections written into config.yaml (e.g. `finetune`).
        on_save: called on rank 0 as on_save(step, checkpoint_folder) after each checkpoint.

    Returns: a TrainResult with the final step and losses.

    Raises:
        FileNotFoundError: missing data, or --resume without a complete checkpoint.
        ValueError: inconsistent config (e.g. vocab smaller than the data's, block_size too long
            for the data).
        RuntimeError: too many consecutive non-finite steps (the last good checkpoint is kept).
    """
    from gptforge.data.shards import load_meta

    data_dir, run_dir = Path(data_dir), Path(run_dir)
    tc, pc = cfg.train, cfg.parallel
    meta = load_meta(data_dir) if data is None else None
    if tc.num_threads:
        torch.set_num_threads(tc.num_threads)
    ds_config = None
    if pc.backend == "deepspeed":
        from gptforge.train.deepspeed_config import deepspeed_run_config

        # Conflicts between the file and gptforge's config are reported before anything starts.
        cfg, ds_config, env_pc = deepspeed_run_config(cfg, int(os.environ.get("WORLD_SIZE", 1)))
        env = D.init_distributed(env_pc, tc.device, force_group=True)
    elif D.launched_by_torchrun() or D.needs_process_group(pc):
        env = D.init_distributed(pc, tc.device)
    else:
        D.validate_layout(pc, 1)
        env = D.DistEnv(device=pick_device(tc.device))
    try:
        return _train(cfg, env, meta, data_dir, run_dir, resume, progress, log,
                      model_factory, data, config_extra, on_save, ds_config=ds_config)
    finally:
        D.shutdown(env)


def _train(cfg: RunConfig, env: D.DistEnv, meta: dict | None, data_dir: Path, run_dir: Path, resume: bool,
           progress: bool, log: Callable[[str], None] | None, model_factory=None, data=None,
           config_extra: dict[str, Any] | None = None, on_save=None, ds_config: dict | None = None) -> TrainResult:
    tc, mc_in, pc = cfg.train, cfg.model, cfg.parallel
    device = env.device
    main = env.is_main
    if main:
        peak = device_peak(device, tc.precision)  # before seeding: measuring uses the RNG
    else:
        peak = Peak(None, "rank 0's figure")

    data_vocab = int(meta["vocab_size"]) if data is None else int(data.vocab_size)
    if mc_in.vocab_size is None:
        mc_in = ModelConfig(**{**to_dict(mc_in), "vocab_size": data_vocab})
    mc = mc_in.resolved()
    if mc.vocab_size < data_vocab:
        raise ValueError(
            f"model.vocab_size={mc.vocab_size} is smaller than the data's vocabulary ({data_vocab}, "
            f"{data_dir if data is not None else data_dir / 'meta.json'}); leave model.vocab_size unset to take "
            "it from the data"
        )
    cfg = RunConfig(model=mc, train=tc, parallel=pc)

    ckpt_root = run_dir / "checkpoints"
    if not resume and ((run_dir / "metrics.jsonl").exists() or any(ckpt_root.glob("step_*"))):
        raise FileExistsError(
            f"{run_dir} already holds a run (metrics.jsonl / checkpoints): continue it with --resume, "
            "or give a new --out; gptforge never mixes two runs in one directory"
        )
    zero = D.effective_zero_stage(pc)
    layout = {"world_size": env.world_size, "dp": env.dp_size, "tp": pc.tp, "pp": pc.pp, "zero_stage": zero}
    config_yaml = run_config_yaml(cfg, data_dir, {"layout": layout, **(config_extra or {})})
    if tc.precision == "fp16" and ds_config is None and (zero in (2, 3) or pc.tp > 1 or pc.pp > 1):
        raise ValueError("train.precision=fp16 needs a gradient scaler, which gptforge supports with a single "
                         "process, DDP and ZeRO-1 only; use bf16 with FSDP2/ZeRO-2/3, tp or pp")

    # Every rank builds the same full model from the same seed; parallelize() keeps its part.
    torch.manual_seed(tc.seed)
    model = model_factory(mc) if model_factory is not None else GPT(mc)
    n_params = model.num_params()
    pp_loss = PipelineLoss()
    engine: TorchBackend | DeepSpeedBackend
    if ds_config is not None:
        apply_activation_checkpointing(model, tc.activation_checkpointing)
        if tc.compile:
            apply_compile(model)
        engine = DeepSpeedBackend(model, ds_config, tc.weight_decay, env)
        par = Parallelized(module=engine.module, core=engine.core, zero_stage=engine.zero_stage)
    else:
        par = parallelize(model, tc, pc, env, pp_loss_fn=pp_loss)
        zero_group = env.group("dp") if par.zero_stage == 1 else None
        optimizer = build_optimizer(par.core, tc, device.type, zero_group=zero_group)
        scaler = torch.amp.GradScaler(device.type) if tc.precision == "fp16" else None
        engine = TorchBackend(par, optimizer, scaler, env, tc.precision)
    core = par.core
    core.train()

    val_stream, val_offsets, train_stream = None, None, None
    if data is not None:
        if par.schedule is not None:
            raise ValueError("pipeline parallelism (parallel.pp > 1) takes token shards only, not instruction data")
        batches = data.batches(mc.block_size, tc, env.dp_rank, env.dp_size)
        has_val = tc.eval_interval > 0 and data.has_val
    else:
        split = meta["splits"]["train"]
        train_stream = TokenStream([data_dir / f for f in split["files"]], meta["dtype"])
        batches = TrainBatches(train_stream, mc.block_size, tc.micro_batch_size, tc.gradient_accumulation_steps,
                               tc.seed, dp_rank=env.dp_rank, dp_size=env.dp_size)
    val_split = meta["splits"].get("val") if data is None else None
    if tc.eval_interval > 0 and val_split and val_split.get("tokens", 0) > mc.block_size + 1:
        val_stream = TokenStream([data_dir / f for f in val_split["files"]], meta["dtype"])
        val_offsets = eval_windows(val_stream, mc.block_size, tc.eval_steps * tc.micro_batch_size)
    if data is None:
        has_val = val_stream is not None
        if tc.eval_interval > 0 and not has_val and env.is_main and log is not None:
            n_val = (val_split or {}).get("tokens", 0)
            log(f"WARNING: no validation: the val split of {data_dir} has {n_val:,} tokens, fewer than one window "
                f"of block_size + 1 = {mc.block_size + 1}; evaluation, the best checkpoint and early stopping are "
                "off. Prepare with a larger --val-fraction (a single big file is one document: split it with "
                "--doc-separator), or use a smaller model.block_size.")

    state: dict[str, Any] = {"step": 0, "tokens_seen": 0, "best_val_loss": None, "evals_since_best": 0,
                             "elapsed_seconds": 0.0}
    if resume:
        found = ckpt_lib.find_checkpoint(run_dir)
        saved = yaml.safe_load((found / "config.yaml").read_text())
        saved_tok = (saved.get("data") or {}).get("tokenizer_sha256")
        if data is None and saved_tok and saved_tok != meta.get("tokenizer_sha256"):
            raise ValueError(
                f"--resume: {data_dir} was tokenized with a different tokenizer (sha256 "
                f"{str(meta.get('tokenizer_sha256'))[:12]}) than the run (sha256 {saved_tok[:12]}, "
                f"{found / 'config.yaml'}); resume with the data the run was trained on "
                f"({(saved.get('data') or {}).get('path')}), or prepare new data with --tokenizer RUN_DIR/tokenizer.json"
            )
        if saved.get("model") != to_dict(mc):
            diff = {k: (v, to_dict(mc).get(k)) for k, v in (saved.get("model") or {}).items() if to_dict(mc).get(k) != v}
            raise ValueError(f"--resume: the model config differs from the checkpoint's ({found / 'config.yaml'}): "
                             + ", ".join(f"model.{k} was {a!r}, now {b!r}" for k, (a, b) in diff.items()))
        saved_gbs = (ckpt_lib.load_trainer_state(found).get("data") or {}).get("global_batch_size")
        if saved_gbs is not None and saved_gbs != batches.global_batch_size:
            raise ValueError(
                f"--resume: the checkpoint {found} was trained with a global batch of {saved_gbs} sequences, "
                f"this layout gives {batches.global_batch_size} (train.micro_batch_size {tc.micro_batch_size} x "
                f"train.gradient_accumulation_steps {tc.gradient_accumulation_steps} x dp {env.dp_size}); set "
                "them so the product matches to continue the same data order"
            )
        state.update(engine.load(found))
    if main:
        # Created only now, after every check above: a run refused for bad input leaves nothing behind.
        run_dir.mkdir(parents=True, exist_ok=True)
        ckpt_lib.atomic_write_text(run_dir / "config.yaml", config_yaml)
        if data is None and (data_dir / "tokenizer.json").exists():  # a run directory is self-contained for inference
            shutil.copyfile(data_dir / "tokenizer.json", run_dir / "tokenizer.json")

    say = (log or (lambda m: None)) if main else (lambda m: None)
    tokens_per_step = getattr(batches, "tokens_per_step", batches.global_batch_size * mc.block_size)
    fpt = flops_per_token(mc, n_params, getattr(batches, "seq_len", mc.block_size))
    say(f"model: {mc.arch}, {n_params:,} parameters, {mc.n_layer} layers, d_model {mc.d_model}, "
        f"block_size {mc.block_size}, vocab {mc.vocab_size}")
    say(f"data: {data.description if data is not None else format(split['tokens'], ',') + ' train tokens'}; "
        f"{tokens_per_step:,} tokens per step; device {device}; "
        f"precision {tc.precision}; MFU against {peak.label}"
        + (f" ({peak.flops_per_second / 1e9:,.0f} GFLOP/s)" if peak.flops_per_second else ""))

    if env.distributed:
        if ds_config is not None:
            say(f"layout: {env.world_size} processes, all data parallel; DeepSpeed engine, ZeRO stage {zero}")
        else:
            say(f"layout: {env.world_size} processes; dp {pc.dp} (replicate {pc.dp_replicate} x shard {pc.dp_shard}), "
                f"tp {pc.tp}, pp {pc.pp}"
                + (f" ({pc.pp_schedule}, {par.n_microbatches} micro-batches)" if pc.pp > 1 else "")
                + f"; ZeRO stage {zero}")
    # Every run checks the planner: its prediction goes beside the measured peak in every row.
    try:
        from gptforge.plan.planner import predict_peak_memory_bytes

        predicted_mem = predict_peak_memory_bytes(mc, tc, pc, device.type if device.type in ("cuda", "mps") else "cpu")
    except ValueError as e:
        predicted_mem = None
        say(f"planner: no memory prediction for this layout ({e})")
    writer = MetricsWriter(run_dir, tensorboard=tc.tensorboard, resume_step=state["step"] if resume else None) \
        if main else _NullWriter()
    bar = Progress(tc.max_steps, state["step"], enabled=progress and main)
    history: list[dict] = []
    stopped, bad_in_row, last_loss, last_val = "max_steps", 0, None, None
    start_step = state["step"]

    def save(step: int, best: bool = False) -> None:
        st = dict(state, data={"seed": tc.seed, "step": step, "global_batch_size": batches.global_batch_size})
        path = engine.save(ckpt_root, step, st, config_yaml, keep=tc.keep_checkpoints, best=best)
        if on_save is not None and main:
            on_save(step, path)

    try:
        with _StopFlag() as stop:
            for step in range(start_step, tc.max_steps):
                t0 = time.perf_counter()
                lr = lr_at(step, tc)
                engine.set_lr(lr)
                micro = batches.micro_batches(step)
                n_local = count_targets(micro)
                # Every tp and pp rank of a dp rank reads the same slice: count each slice once.
                (n_sum,) = env.all_reduce_sum([n_local])
                n_tokens = int(round(n_sum / (env.tp_size * env.pp_size)))
                # DDP/FSDP2 average gradients over the dp ranks: divide by the global count / dp.
                divisor = n_tokens / env.dp_size
                if par.schedule is not None:
                    loss_sum = pipeline_forward_backward(par, pp_loss, micro, divisor, device, tc.precision)
                else:
                    loss_sum = forward_backward(par.module, micro, divisor, device, engine.autocast_precision,
                                                grad_sync=engine.grad_sync, backward=engine.backward)
                grad_norm = engine.clip(tc.grad_clip if tc.grad_clip > 0 else float("inf"))
                # Loss sums live on the last pp stage of each dp rank, repeated on its tp ranks.
                (total_loss,) = env.all_reduce_sum([float(loss_sum)])
                loss = total_loss / env.tp_size / max(n_tokens, 1)
                finite = math.isfinite(loss) and math.isfinite(grad_norm)
                skipped = engine.step(finite)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                dt = time.perf_counter() - t0
                mem = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
                # Per-rank throughput and memory, and whether any rank was signalled, to every rank.
                stats = env.gather_stats([tokens_per_step / env.dp_size / dt, dt, -1 if mem is None else mem,
                                          float(stop.signal is not None)])
                dt = max(r[1] for r in stats)
                done = step + 1
                state["step"] = done
                state["tokens_seen"] += tokens_per_step
                state["elapsed_seconds"] += dt
                # Under fp16 the scaler's own skipped steps are routine; only a bad loss counts there.
                bad = not math.isfinite(loss) if engine.has_loss_scaler else not finite
                bad_in_row = bad_in_row + 1 if bad else 0
                state["skipped_steps"] = state.get("skipped_steps", 0) + int(skipped)
                tps = tokens_per_step / dt
                row: dict[str, Any] = {
                    "step": done, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                    "tokens_per_second": tps,
                    "mfu": tps * fpt / (peak.flops_per_second * env.world_size) if peak.flops_per_second else None,
                    "peak_memory_bytes": max(r[2] for r in stats) if mem is not None else None,
                    "predicted_memory_bytes": predicted_mem,
                    "tokens_seen": state["tokens_seen"], "step_seconds": dt,
                    "elapsed_seconds": state["elapsed_seconds"], "skipped": skipped,
                }
                if env.world_size > 1:
                    row["tokens_per_second_rank_min"] = min(r[0] for r in stats)
                    row["tokens_per_second_rank_max"] = max(r[0] for r in stats)
                    row["peak_memory_bytes_rank_min"] = min(r[2] for r in stats) if mem is not None else None
                last_loss = loss if math.isfinite(loss) else last_loss
                if done == start_step + 1 and predicted_mem is not None:
                    measured = (f"measured peak {row['peak_memory_bytes'] / 2**30:.2f} GiB (max_memory_allocated)"
                                if row["peak_memory_bytes"] is not None else "no allocator peak on this device")
                    bar.log(f"memory per device: planner predicted {predicted_mem / 2**30:.2f} GiB of tensors; {measured}")
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
                if has_val and (done % tc.eval_interval == 0 or is_last):
                    if data is not None:
                        last_val = data.evaluate(par.module, device, tc.precision)
                    elif par.schedule is not None:
                        last_val = pipeline_evaluate(par, pp_loss, val_stream, val_offsets, mc.block_size,
                                                     tc.micro_batch_size * tc.gradient_accumulation_steps,
                                                     device, tc.precision, env)
                    else:
                        last_val = evaluate_windows(par.module, val_stream, val_offsets, mc.block_size,
                                                    tc.micro_batch_size, device, engine.autocast_precision)
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
                interrupted = any(r[3] > 0 for r in stats)
                stop_here = tc.stop_at_step and done >= tc.stop_at_step
                # A skipped (non-finite) step is not checkpointed on schedule: a run in a bad streak
                # keeps its last good checkpoint as `latest`.
                periodic = tc.checkpoint_interval > 0 and done % tc.checkpoint_interval == 0 and not bad
                if new_best or periodic or is_last or early or interrupted or stop_here:
                    save(done, best=new_best)
                if early:
                    stopped = "early_stopping"
                    bar.log(f"early stopping at step {done}: no val improvement in {tc.patience} evaluations")
                    break
                if interrupted:
                    stopped = "signal"
                    bar.log(f"signal {stop.signal or 'on another rank'} received: checkpoint written at step {done}; "
                            "continue with --resume")
                    break
                if stop_here:
                    stopped = "stop_at_step"
                    break
    finally:
        bar.close()
        writer.close()
        if train_stream is not None:
            train_stream.close()
        if data is not None:
            data.close()
        if val_stream is not None:
            val_stream.close()
    return TrainResult(run_dir=run_dir, step=state["step"], train_loss=last_loss, val_loss=last_val,
                       best_val_loss=state["best_val_loss"], stopped=stopped,
                       tokens_seen=state["tokens_seen"], history=history,
                       signal=(stop.signal or signal.SIGTERM) if stopped == "signal" else None)
