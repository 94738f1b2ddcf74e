"""The Trainer: one loop for every layout, pretraining and fine-tuning alike.

`Trainer.train()` reads top to bottom: `train_step` -> bad-step guard -> `evaluator` ->
`early_stop` -> `metrics` -> `checkpointer`; each component (gptforge.train.components) decides
whether a step is its step and owns its state. Data comes through a `BatchSource`
(gptforge.train.sources) and what a step minimises is an `Objective` (gptforge.train.objectives),
so the loop never asks which kind of data or loss it trains on; the layout
(single process, DDP, FSDP2, TP, PP, DeepSpeed) is hidden behind the engine (gptforge.train.parallel.backend)
and the step function chosen once at set-up (gptforge.train.step). The run is resolved once, first
(gptforge.train.resolve): `self.run`, a frozen ResolvedRun, is the only config read after that.
Every stateful component is registered with the checkpointer (gptforge.train.state), which saves
them all and reloads them all by one path, for --resume and for a spike rollback
(gptforge.train.rollback.SpikeRollback) alike; the end-of-run samples and report are
gptforge.train.samples.write_run_end.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, cast

import torch
import yaml

from gptforge.atomic import atomic_write_text
from gptforge.config import ModelConfig, ParallelConfig, RunConfig
from gptforge.errors import InputError
from gptforge.model.gpt import GPT
from gptforge.plan.flops import flops_per_token
from gptforge.runtime import checkpoint as ckpt_lib
from gptforge.runtime.activation import apply_activation_checkpointing
from gptforge.train.components import (
    BadStepGuard,
    Checkpointer,
    EarlyStopping,
    Evaluator,
    MetricsLogger,
    NullWriter,
    StopFlag,
    TaskEvaluator,
)
from gptforge.train.loggers import MetricsWriter, Progress
from gptforge.train.mfu import Peak, device_peak
from gptforge.train.objectives import Layout, NextToken, Objective
from gptforge.train.optim import build_optimizer, lr_at
from gptforge.train.parallel import distributed as D
from gptforge.train.parallel.backend import DeepSpeedBackend, TorchBackend
from gptforge.train.parallel.parallelize import Parallelized, apply_compile, parallelize, place_frozen
from gptforge.train.resolve import resolve_training
from gptforge.train.resume import check_resume, nothing_to_resume
from gptforge.train.rollback import RollbackState, SpikeRollback
from gptforge.train.samples import write_run_end
from gptforge.train.sources import BatchSource, ModelHandle
from gptforge.train.spikes import SpikeDetector
from gptforge.train.state import Fields
from gptforge.train.step import (
    PipelineLoss,
    StepSums,
    forward_backward_sums,
    onednn_linear_for,
    pipeline_evaluate,
    pipeline_forward_backward,
)
from gptforge.train.wandb_logger import WandbLogger


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
    max_steps: int | None = None
    """train.max_steps of the session."""
    main: bool = True
    """Whether this process is rank 0 (or the only one): commands print `summary()` from it alone."""

    def summary(self) -> str:
        """One line saying how the run ended."""
        if not self.history and self.stopped == "max_steps":
            return (f"nothing to do: {self.run_dir} is already at step {self.step}, not before train.max_steps "
                    f"{self.max_steps if self.max_steps is not None else self.step}; raise --train.max_steps past "
                    f"{self.step} to train further")
        val = f", val loss {self.val_loss:.4f}" if self.val_loss is not None else ""
        train_loss = f"{self.train_loss:.4f}" if self.train_loss is not None else "n/a"
        return (f"stopped ({self.stopped}) at step {self.step}: train loss {train_loss}{val}; "
                f"run directory {self.run_dir}")

    @property
    def exit_code(self) -> int:
        """128 + signal for a run stopped by SIGINT/SIGTERM (as a shell reports a killed program),
        so that schedulers can tell it from a finished run; 0 otherwise."""
        return 128 + int(self.signal) if self.signal else 0


class Trainer:
    """Set up a run (model, layout, engine, data, resume) and train it.

    Args:
        cfg: the user's model/train/parallel config, resolved once into `self.run` (also `self.cfg`;
            `tc`, `mc`, `pc` are its sections) by gptforge.train.resolve.resolve_training;
            `model.vocab_size` defaults to the source's vocabulary.
        env: where this process sits (gptforge.train.parallel.distributed.DistEnv).
        source: the BatchSource. run_dir: output folder. resume: continue from checkpoints/latest.
        model_factory: builds the model from the resolved ModelConfig in place of `GPT(cfg)`
            (called after seeding; only parameters with requires_grad are optimized).
        config_extra: extra top-level sections written into config.yaml (e.g. `finetune`).
        on_save: called on rank 0 as on_save(step, checkpoint_folder) after each checkpoint.
        ds_config: a DeepSpeed config dict (backend deepspeed), else None; the engine gets it with
            the resolved run's lr, batch and precision (`self.ds_config`).
        objective: what a training step minimises (gptforge.train.objectives; default NextToken,
            the summed next-token loss), e.g. distillation; evaluation keeps the source's loss.
        requested_parallel: the parallel section as asked for (degrees of -1 unresolved), which
            config.yaml keeps so that a resume re-resolves it for its own world size; `layout`
            records what it resolved to. Default: cfg.parallel.

    Raises:
        FileExistsError: run_dir holds another run and resume is False.
        InputError: inconsistent config or data (the message names the field); pipeline
            parallelism with an objective or source that does not run under it.
    """

    def __init__(self, cfg: RunConfig, env: D.DistEnv, source: BatchSource, run_dir: Path, resume: bool = False,
                 progress: bool = True, log: Callable[[str], None] | None = None, *,
                 model_factory: Callable[[ModelConfig], torch.nn.Module] | None = None,
                 config_extra: dict[str, Any] | None = None, on_save: Callable[[int, Path], None] | None = None,
                 ds_config: dict | None = None, requested_parallel: ParallelConfig | None = None,
                 objective: Objective | None = None):
        self.env, self.source, self.run_dir = env, source, Path(run_dir)
        self.objective: Objective = objective if objective is not None else NextToken()
        self.stopped: str | None = None
        self.device, self.main = env.device, env.is_main
        self.say = (log or (lambda m: None)) if self.main else (lambda m: None)
        self.ckpt_root = self.run_dir / "checkpoints"
        if resume and nothing_to_resume(self.run_dir, self.main, self.say):
            resume = False
        # Resolved once (gptforge.train.resolve): nothing below reads the user's cfg.
        self.run = self.cfg = run = resolve_training(cfg, env, source, self.run_dir, resume, self.say,
                                                     deepspeed=ds_config is not None,
                                                     requested_parallel=requested_parallel)
        self.tc, self.mc, self.pc = run.train, run.model, run.parallel
        tc, mc = run.train, run.model
        self.compile_probe, self.budget_spent_s = run.compile_probe, run.budget_spent_s
        self.peak = device_peak(self.device, tc.precision) if self.main else Peak(None, "rank 0's figure")
        metrics = self.run_dir / "metrics.jsonl"
        if not resume and ((metrics.exists() and metrics.stat().st_size > 0) or any(self.ckpt_root.glob("step_*"))):
            raise FileExistsError(
                f"{self.run_dir} already holds a run (metrics.jsonl / checkpoints): continue it with --resume, "
                "or give a new --out; gptforge never mixes two runs in one directory"
            )
        self.zero = run.zero_stage
        self.config_yaml = run.config_yaml(source.provenance(), config_extra)
        if ds_config is not None:  # the engine's JSON takes the resolved lr, batch and precision
            from gptforge.train.parallel.deepspeed_config import resolved_deepspeed_config

            ds_config = resolved_deepspeed_config(ds_config, tc, env.dp_size)
        self.ds_config = ds_config
        self._check_pipeline()
        source.check_window(mc.block_size)  # before the model: a block_size no data fills would allocate first
        self._build_model_and_engine(model_factory, ds_config)
        self._bind_model()
        self.batches = source.batches(mc.block_size, tc, env.dp_rank, env.dp_size)
        self.tokens_per_step = self.batches.tokens_per_step
        self.fpt = flops_per_token(mc, self.n_params, self.batches.seq_len)
        self.state: dict[str, Any] = {"step": 0, "tokens_seen": 0, "elapsed_seconds": 0.0, "skipped_steps": 0}
        self.early_stop = self._early_stopping()
        # An absolute ceiling (ln V + margin) only where the objective has one (next-token loss).
        ceiling = self.objective.loss_ceiling(mc.vocab_size)
        self.spikes = (SpikeDetector(grad_clip=tc.grad_clip, warmup_steps=tc.warmup_steps, loss_ceiling=ceiling)
                       if tc.spike_alarms else None)
        self.rollback = RollbackState(tc.max_rollbacks)
        self.wandb = (WandbLogger(self.run_dir, tc.wandb_project, tc.wandb_entity, tc.wandb_run_name, tc.wandb_mode,
                                  config=yaml.safe_load(self.config_yaml))
                      if tc.wandb_project and self.main else None)
        self.checkpointer = self._checkpointer(on_save)
        self.resumed = resume
        if resume:
            self._resume()
        if self.main:
            # Created only now, after every check: a run refused for bad input leaves nothing behind.
            self.run_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.run_dir / "config.yaml", self.config_yaml)
            if source.tokenizer_file is not None:  # a run directory is self-contained for inference
                shutil.copyfile(source.tokenizer_file, self.run_dir / "tokenizer.json")
        self._components(progress, resume)
        self._announce(ds_config)

    # -- set-up ------------------------------------------------------------------------------

    def _early_stopping(self) -> EarlyStopping:
        metric = self.tc.best_metric
        per_source = [f"val/{n}/loss" for n in self.source.source_tokens or {}]
        own = self.source.val_metric_names
        if metric in own:
            return EarlyStopping(self.tc.patience, metric, True)
        if metric != "val_loss" and metric not in per_source and not (metric.startswith("eval/") and self.tc.eval_tasks):
            raise InputError(f"train.best_metric={metric!r}: use val_loss, "
                             + "".join(f"{m}, " for m in (*per_source, *own))
                             + "or eval/<task>/<metric> of a task in train.eval_tasks")
        from gptforge.eval.runner import higher_is_better

        return EarlyStopping(self.tc.patience, metric, metric.startswith("eval/") and higher_is_better(metric))

    def _task_evaluator(self) -> TaskEvaluator:
        """train.eval_tasks, loaded once; scored on the whole model on every rank under FSDP (its
        forward is collective), on rank 0 only otherwise."""
        tc = self.tc
        if tc.eval_chat and not tc.eval_tasks:
            raise InputError("train.eval_chat true needs train.eval_tasks (the task files to score through the chat "
                             "template)")
        if not tc.eval_tasks:
            return TaskEvaluator(dict, tc.eval_interval, tc.max_steps, enabled=False)
        if self.par.schedule is not None:
            raise InputError("train.eval_tasks: task evaluation does not run under pipeline parallelism (parallel.pp)")
        from gptforge.data.tokenizer import Tokenizer
        from gptforge.eval.runner import evaluate_tasks, log_items
        from gptforge.eval.tasks import load_task

        tasks = [load_task(p) for p in tc.eval_tasks]
        tok_file = self.run_dir / "tokenizer.json"
        if not tok_file.is_file():
            raise InputError(f"train.eval_tasks needs the run's tokenizer, and {tok_file} does not exist")
        tok = Tokenizer.from_file(tok_file)
        from gptforge.eval.chat import chat_format_of_run

        chat = chat_format_of_run(self.run_dir) if tc.eval_chat else None
        runs_here = self.par.fsdp or self.main
        model = self.par.core

        def score() -> dict[str, float]:
            if not runs_here:
                return {}
            # par.core is the GPT itself (FSDP2 shards it in place; its class stays a GPT subclass)
            return log_items(evaluate_tasks(cast(GPT, model), tok, tasks, self.device, self.engine.autocast_precision,
                                            limit=tc.eval_tasks_limit, chat=chat))

        return TaskEvaluator(score, tc.eval_interval, tc.max_steps, enabled=True)

    def _build_model_and_engine(self, model_factory, ds_config: dict | None) -> None:
        tc, mc, pc, env = self.tc, self.mc, self.pc, self.env
        # Every rank builds the same full model from the same seed; parallelize() keeps its part.
        torch.manual_seed(tc.seed)
        model = model_factory(mc) if model_factory is not None else GPT(mc)
        self.n_params = model.num_params()
        self.pp_loss = PipelineLoss(self.objective)
        if ds_config is not None:
            apply_activation_checkpointing(model, tc.activation_checkpointing)
            if tc.compile:
                apply_compile(model)
            self.engine: DeepSpeedBackend | TorchBackend = DeepSpeedBackend(model, ds_config, tc.weight_decay, env)
            self.par = Parallelized(module=self.engine.module, core=self.engine.core,
                                    zero_stage=self.engine.zero_stage)
        else:
            self.par = parallelize(model, tc, pc, env, pp_loss_fn=self.pp_loss)
            zero_group = env.group("dp") if self.par.zero_stage == 1 else None
            optimizer = build_optimizer(self.par.core, tc, self.device.type, zero_group=zero_group)
            scaler = torch.amp.GradScaler(self.device.type) if tc.precision == "fp16" else None
            self.engine = TorchBackend(self.par, optimizer, scaler, env, tc.precision)
        self.par.core.train()

    def _check_pipeline(self) -> None:
        """Refuse, before the model is built, an objective or source that does not run under
        pipeline parallelism (the last stage sees only logits and targets; evaluation reads a
        token stream)."""
        if self.pc.pp <= 1:
            return
        if not self.objective.supports_pipeline:
            raise InputError(f"{self.objective.name} does not run under pipeline parallelism (parallel.pp > 1): "
                             "use data, tensor or FSDP2 parallelism")
        if not self.source.supports_pipeline:
            raise InputError(f"pipeline parallelism (parallel.pp > 1) takes token shards of one source, not "
                             f"{self.source.description}")

    def _bind_model(self) -> None:
        """The laid-out policy to the objective (`setup`: a frozen reference placed like it) and
        to the source (`bind`: batches made with the model)."""
        tc, pc, env = self.tc, self.pc, self.env
        handle = ModelHandle(core=self.par.core, module=self.par.module, device=self.device,
                             precision=self.engine.autocast_precision, env=env)
        self.objective.setup(Layout(policy=handle, model=self.mc, train=tc, parallel=pc, run_dir=self.run_dir,
                                    place=lambda m: place_frozen(cast(GPT, m), tc, pc, env)))
        self.source.bind(handle)

    def _checkpointer(self, on_save) -> Checkpointer:
        """The checkpointer, with the stateful components registered: one save and one reload
        (gptforge.train.state) for --resume and rollback alike."""
        tc, gbs = self.tc, self.batches.global_batch_size
        ck = Checkpointer(self.engine, self.ckpt_root, self.config_yaml, tc.checkpoint_interval, tc.keep_checkpoints,
                          lambda step: {"seed": tc.seed, "step": step, "global_batch_size": gbs}, on_save, self.main)
        ck.register(None, Fields(self.state, ("step", "tokens_seen", "skipped_steps")))
        # A rollback keeps the wall time spent, its own record and the W&B run going.
        ck.register(None, Fields(self.state, ("elapsed_seconds",)), on_rollback=False)
        ck.register(None, self.early_stop)
        if self.spikes is not None:
            ck.register("spikes", self.spikes)
        ck.register("rollback", self.rollback, on_rollback=False)
        ck.register("objective", self.objective)  # e.g. an RL sampler's RNG, precomputed reference log-probs
        ck.register("source", self.source)
        if self.wandb is not None:
            ck.register("wandb", self.wandb, on_rollback=False)
        return ck

    def _resume(self) -> None:
        found = ckpt_lib.find_checkpoint(self.run_dir)
        check_resume(found, self.source, self.mc, self.tc, self.batches.global_batch_size, self.env.dp_size)
        loaded, removed = self.checkpointer.restore(found)
        self.say(f"resuming from {found} (step {loaded.get('step', 0)})")
        for d in removed:  # folders newer than the resume point are of an abandoned history
            self.say(f"--resume: removed {d.name}, newer than the resume point (damaged or abandoned)")

    def _components(self, progress: bool, resume: bool) -> None:
        tc, par = self.tc, self.par
        if par.schedule is not None:  # objective and source were checked by _check_pipeline
            rows = tc.micro_batch_size * tc.gradient_accumulation_steps
            val = self.source.pipeline_val()

            def evaluate():
                return None if val is None else pipeline_evaluate(par, self.pp_loss, val[0], val[1], self.mc.block_size,
                                                                  rows, self.device, tc.precision, self.env)

            def step_fn(micro, divisor) -> StepSums:
                return StepSums(pipeline_forward_backward(par, self.pp_loss, micro, divisor, self.device,
                                                          tc.precision))
        else:
            def evaluate():
                return self.source.evaluate(par.module, self.device, self.engine.autocast_precision,
                                            should_stop=lambda: self.stop_flag.signal is not None)

            dnn = onednn_linear_for(tc.onednn_linear, self.device, self.engine.autocast_precision, bool(tc.compile))

            def step_fn(micro, divisor) -> StepSums:
                return forward_backward_sums(par.module, micro, divisor, self.device, self.engine.autocast_precision,
                                             grad_sync=self.engine.grad_sync, backward=self.engine.backward,
                                             objective=self.objective, use_onednn_linear=dnn)
        self.step_fn = step_fn
        self.evaluator = Evaluator(evaluate, tc.eval_interval, tc.max_steps, enabled=self.source.has_val)
        self.task_evaluator = self._task_evaluator()
        self.bad_steps = BadStepGuard(tc.max_bad_steps, self.engine.has_loss_scaler, self.ckpt_root)
        self.checkpointer.register(None, self.bad_steps)  # a reload starts a new streak
        writer = MetricsWriter(self.run_dir, tensorboard=tc.tensorboard,
                               resume_step=self.state["step"] if resume else None) if self.main else NullWriter()
        self.metrics = MetricsLogger(writer, Progress(tc.max_steps, self.state["step"], enabled=progress and self.main),
                                     tc.log_interval, tc.max_steps, extra_sinks=[self.wandb] if self.wandb else [],
                                     mfu_label="mfu est." if self.device.type == "cpu" else "mfu",
                                     has_peak=bool(self.peak.flops_per_second))
        self.spike_rollback = SpikeRollback(self.rollback, self.checkpointer, self.bad_steps, self.metrics,
                                            self.run_dir, tc, on_stop=self._stop_with)
        # Every run checks the planner: its prediction goes beside the measured peak in every row.
        try:
            from gptforge.plan.planner import predict_peak_memory_bytes

            kind = self.device.type if self.device.type in ("cuda", "mps") else "cpu"
            self.predicted_mem = predict_peak_memory_bytes(self.mc, tc, self.pc, kind) + self.source.extra_memory_bytes()
        except ValueError as e:
            self.predicted_mem = None
            self.say(f"planner: no memory prediction for this layout ({e})")
        self._check_host_memory()

    def _check_host_memory(self) -> None:
        """On a CPU, refuse a step the planner predicts to need more than this machine's memory
        (a 100,000-token context would otherwise swap for many minutes before failing)."""
        if self.device.type != "cpu" or self.predicted_mem is None:
            return
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return
        if self.predicted_mem > 0.9 * total:
            from gptforge.plan.advice import out_of_memory_message

            raise InputError("this step does not fit in this machine's memory: "
                             + out_of_memory_message(self.mc, self.tc, self.pc, int(0.9 * total), None)
                             .replace("out of memory: ", "", 1))

    def _announce(self, ds_config) -> None:
        mc, tc, pc, env = self.mc, self.tc, self.pc, self.env
        self.say(f"model: {mc.arch}, {self.n_params:,} parameters, {mc.n_layer} layers, d_model {mc.d_model}, "
                 f"block_size {mc.block_size}, vocab {mc.vocab_size}")
        self.say(f"data: {self.source.description}; {self.tokens_per_step:,} tokens per step; device {self.device}; "
                 f"precision {tc.precision}; MFU against {self.peak.label}"
                 + (f" ({self.peak.flops_per_second / 1e9:,.1f} GFLOP/s)" if self.peak.flops_per_second else ""))
        if not env.distributed:
            return
        if ds_config is not None:
            self.say(f"layout: {env.world_size} processes, all data parallel; DeepSpeed engine, ZeRO stage {self.zero}")
        else:
            self.say(f"layout: {env.world_size} processes; dp {pc.dp} (replicate {pc.dp_replicate} x shard "
                     f"{pc.dp_shard}), tp {pc.tp}, pp {pc.pp}"
                     + (f" ({pc.pp_schedule}, {self.par.n_microbatches} micro-batches)" if pc.pp > 1 else "")
                     + f"; ZeRO stage {self.zero}")

    # -- the loop ----------------------------------------------------------------------------

    def train(self) -> TrainResult:
        """Train from the current step to train.max_steps (or an earlier stop). Returns the result.

        Raises:
            TrainingError: too many consecutive non-finite steps (the last good checkpoint is kept),
                or a spike after train.max_rollbacks rollbacks (train.spike_action rollback).
        """
        tc, start = self.tc, self.state["step"]
        self.stopped = "max_steps"
        self.last_loss: float | None = None
        try:
            with StopFlag() as stop:
                self.stop_flag = stop
                while self.state["step"] < tc.max_steps:  # a rollback moves state["step"] back
                    row, finite, interrupted = self.train_step(self.state["step"], stop)
                    done = row["step"]
                    bad = self.bad_steps.update(done, row["loss"], finite)
                    first = done == start + 1 and not self.spike_rollback.rolled_back
                    if first:
                        self._report_memory(row)
                    if self.bad_steps.in_row >= tc.max_bad_steps and tc.spike_action != "rollback":
                        self.metrics.log(row, force=True)
                        self.stopped = "non_finite"
                        self.bad_steps.check()
                    val = self.evaluator.maybe_evaluate(done)
                    if val is not None:
                        row["val_loss"] = val
                        row.update(self.source.val_metrics())
                    row.update(self.task_evaluator.maybe_evaluate(done))
                    new_best = self.early_stop.update(row.get(self.early_stop.metric))
                    self._add_events(row, first=first)
                    if self.spike_rollback.maybe_roll_back(row):
                        continue
                    self.metrics.log(row, force=bool(row.get("events")))
                    self.metrics.progress(row, self.evaluator.last)
                    reason = self._stop_reason(done, interrupted)
                    self.checkpointer.maybe_save(done, best=new_best, bad=bad,
                                                 force=done == tc.max_steps or reason is not None)
                    if reason is not None:
                        self._say_stop(reason, done, stop)
                        self.stopped = reason
                        break
        finally:
            self.close()
        return TrainResult(run_dir=self.run_dir, step=self.state["step"], train_loss=self.last_loss,
                           val_loss=self.evaluator.last, best_val_loss=self.early_stop.best_val_loss,
                           stopped=self.stopped or "max_steps", tokens_seen=self.state["tokens_seen"], history=self.metrics.history,
                           signal=(stop.signal or signal.SIGTERM) if self.stopped == "signal" else None,
                           max_steps=tc.max_steps, main=self.main)

    def train_step(self, step: int, stop: StopFlag) -> tuple[dict[str, Any], bool, bool]:
        """One optimizer step (0-based `step`). Returns (metrics row, finite, any rank signalled)."""
        env, engine, tc = self.env, self.engine, self.tc
        t0 = time.perf_counter()
        lr = lr_at(step, tc)
        engine.set_lr(lr)
        index = self.rollback.data_index(step)
        micro = self.batches.micro_batches(index)
        drawn = self.batches.step_metrics(index)
        # The objective's units (target tokens, sequences, pairs), counted before any forward.
        # Every tp and pp rank of a dp rank reads the same slice: count each slice once.
        (n_sum,) = env.all_reduce_sum([sum(self.objective.count(mb) for mb in micro)])
        n_units = int(round(n_sum / (env.tp_size * env.pp_size)))
        # DDP/FSDP2 average gradients over the dp ranks: divide by the global count / dp.
        sums = self.step_fn(micro, n_units / env.dp_size)
        grad_norm = engine.clip(tc.grad_clip if tc.grad_clip > 0 else float("inf"))
        # Loss sums live on the last pp stage of each dp rank, repeated on its tp ranks.
        total_loss, *metric_sums = env.all_reduce_sum([float(sums.loss), *self._metric_values(sums)])
        loss = total_loss / env.tp_size / max(n_units, 1)
        objective_metrics = {name: metric_sums[2 * i] / metric_sums[2 * i + 1]
                             for i, name in enumerate(self.objective.metric_names) if metric_sums[2 * i + 1] > 0}
        finite = math.isfinite(loss) and math.isfinite(grad_norm)
        skipped = engine.step(finite)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        dt = time.perf_counter() - t0
        mem = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None
        # Per-rank throughput and memory, and whether any rank was signalled, to every rank.
        stats = env.gather_stats([self.tokens_per_step / env.dp_size / dt, dt, -1 if mem is None else mem,
                                  float(stop.signal is not None)])
        dt = max(r[1] for r in stats)
        self.state["step"] = step + 1
        self.state["tokens_seen"] += self.tokens_per_step
        self.state["elapsed_seconds"] += dt
        self.state["skipped_steps"] += int(skipped)
        if math.isfinite(loss):
            self.last_loss = loss
        row = {**self._row(loss, lr, grad_norm, dt, stats, mem is not None, skipped), **objective_metrics, **drawn}
        return row, finite, any(r[3] > 0 for r in stats)

    def _metric_values(self, sums: StepSums) -> list[float]:
        """[sum, weight] of each of the objective's declared metrics, 0 where this rank has none
        (a pipeline stage without the loss), flattened for one all-reduce."""
        out: list[float] = []
        for name in self.objective.metric_names:
            value, weight = sums.metrics.get(name, (0.0, 0.0))
            out += [float(value), float(weight)]
        return out

    def _row(self, loss, lr, grad_norm, dt, stats, has_mem: bool, skipped: bool) -> dict[str, Any]:
        tps = self.tokens_per_step / dt
        row: dict[str, Any] = {
            "step": self.state["step"], "loss": loss, "lr": lr, "grad_norm": grad_norm,
            "tokens_per_second": tps,
            "mfu": self._mfu(tps),
            "peak_memory_bytes": max(r[2] for r in stats) if has_mem else None,
            "predicted_memory_bytes": self.predicted_mem,
            "tokens_seen": self.state["tokens_seen"], "step_seconds": dt,
            "elapsed_seconds": self.state["elapsed_seconds"], "skipped": skipped,
        }
        if self.engine.loss_scale is not None:  # fp16: the scale this step used
            row["loss_scale"] = self.engine.loss_scale
        if self.env.world_size > 1:
            row["tokens_per_second_rank_min"] = min(r[0] for r in stats)
            row["tokens_per_second_rank_max"] = max(r[0] for r in stats)
            row["peak_memory_bytes_rank_min"] = min(r[2] for r in stats) if has_mem else None
        return row

    def _add_events(self, row: dict[str, Any], first: bool) -> None:
        """Alarms of this step (spike detector) and a resume mark, as row["events"]."""
        events = [{"kind": "resume", "step": row["step"]}] if first and self.resumed else []
        for e in (self.spikes.update(row["step"], row) if self.spikes is not None else []):
            events.append(e.as_dict())
            self.metrics.message(e.message())
        if events:
            row["events"] = events

    def _mfu(self, tokens_per_second: float) -> float | None:
        """Achieved / peak FLOP/s (PaLM, appendix B). Above 100% the measured peak cannot be right
        (a CPU's peak moves with its load): None, shown as n/a, rather than a wrong figure."""
        peak = self.peak.flops_per_second
        if not peak:
            return None
        mfu = tokens_per_second * self.fpt / (peak * self.env.world_size)
        return mfu if mfu <= 1.0 else None

    def _report_memory(self, row: dict[str, Any]) -> None:
        if self.predicted_mem is None:
            return
        measured = (f"measured peak {row['peak_memory_bytes'] / 2**30:.2f} GiB (max_memory_allocated)"
                    if row["peak_memory_bytes"] is not None else "no allocator peak on this device")
        self.metrics.message(f"memory per device: planner predicted {self.predicted_mem / 2**30:.2f} GiB of "
                             f"tensors; {measured}")

    def _stop_reason(self, done: int, interrupted: bool) -> str | None:
        """Why the run stops after step `done` (the first that holds, in this order), or None."""
        tc = self.tc
        out_of_time = tc.max_minutes > 0 and self.state["elapsed_seconds"] + self.budget_spent_s >= tc.max_minutes * 60
        reasons = (("early_stopping", self.early_stop.should_stop), ("signal", interrupted),
                   ("stop_at_step", bool(tc.stop_at_step) and done >= tc.stop_at_step), ("max_minutes", out_of_time))
        return next((name for name, hit in reasons if hit), None)

    def _stop_with(self, reason: str) -> None:
        """Record why the run stopped (a spike after the last allowed rollback)."""
        self.stopped = reason

    def _say_stop(self, reason: str, step: int, stop: StopFlag) -> None:
        if reason == "early_stopping":
            self.metrics.message(f"early stopping at step {step}: no val improvement in {self.tc.patience} "
                                 "evaluations")
        elif reason == "max_minutes":
            self.metrics.message(f"train.max_minutes {self.tc.max_minutes:g} used up at step {step}: checkpoint "
                                 "written; continue with --resume and a larger --train.max_minutes")
        elif reason == "signal":
            self.metrics.message(f"signal {stop.signal or 'on another rank'} received: checkpoint written at step "
                                 f"{step}; continue with --resume")

    def close(self) -> None:
        """End of the run, however it ended: close the logs and data, write the report (rank 0)."""
        self.metrics.close()
        self.source.close()
        if self.main and self.tc.report and (self.run_dir / "metrics.jsonl").exists():
            # A sharded model (distributed, or no whole module on this rank) gets no samples.
            whole = cast(GPT, self.par.core) if not self.env.distributed and self.par.module is not None else None
            path = write_run_end(self.run_dir, self.stopped, whole, self.device, self.source.data_dir,
                                 self.state["step"])
            self.say(f"report: {path}")
            if self.wandb is not None:
                self.wandb.log_report(path)
        if self.wandb is not None:
            self.wandb.finish()
