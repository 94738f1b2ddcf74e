"""Resolve once: every default of a training run is filled here, before anything is built.

Two stages, each a plain function:

- `pre_resolve`: what the start-up probes (compile choice, time budget) run on: the model shape
  (vocabulary from the data, preset expanded), the batch (gradient_accumulation_steps from
  global_batch_size for this number of data-parallel ranks), the precision the caller measured,
  and the size-aware lr / min_lr / muon_lr, which depend on model.d_model only
  (gptforge.train.optim.resolve_lr_defaults).
- `resolve_run`: the user's config, the world (DistEnv), the data (its meta.json's vocabulary)
  and the probes' results (`Probes`) -> a frozen `ResolvedRun` in which no training field is
  optional: lr, min_lr, warmup_steps, muon_lr, global_batch_size, gradient_accumulation_steps,
  precision, compile (a bool), document_mask (a bool), max_steps (from max_minutes when set).

`resolve_training` runs the probes between the two for the trainer. The ResolvedRun is written to
config.yaml and is the only config the trainer, optimizer, scheduler, DeepSpeed JSON, planner and
report read.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any, Callable

import yaml

from gptforge.config import ModelConfig, ParallelConfig, Precision, RunConfig, TrainConfig, to_dict
from gptforge.errors import InputError
from gptforge.runtime import checkpoint as ckpt_lib
from gptforge.train.compile_choice import CompileProbe

REQUIRED_TRAIN = ("lr", "min_lr", "warmup_steps", "muon_lr", "global_batch_size")
"""train.* fields that are None in a user's config and never None in a ResolvedRun."""

PRECISIONS = ("fp32", "bf16", "fp16")
"""What train.precision resolves to (auto is measured; fp8 is planner-only)."""


@dataclass(frozen=True)
class Probes:
    """What the start-up measurements found, the inputs of `resolve_run` besides the config.

    precision: train.precision as resolved (rank 0's choice under auto).
    compile: train.compile as resolved (bool). compile_probe: the CPU compile probe's figures
        when it ran (else None).
    step_seconds: seconds per optimizer step for the time budget (train.max_minutes), with
        `step_how` saying where it came from; None when max_minutes is off or already resolved.
    spent_seconds: wall seconds the probes took, counted against train.max_minutes.
    saved_train: the `train` section of the checkpoint's config.yaml on resume, else None; its
        lr / min_lr / warmup_steps / muon_lr win over the rules for fields unset now.
    """

    precision: Precision
    compile: bool
    compile_probe: CompileProbe | None = None
    step_seconds: float | None = None
    step_how: str = ""
    spent_seconds: float = 0.0
    saved_train: dict | None = None
    resume_step: int | None = None
    """The step of the checkpoint resumed from (None for a new run)."""


@dataclass(frozen=True)
class ResolvedRun:
    """The run as it trains: no training field is optional. Built by `resolve_run` only.

    model: resolved ModelConfig (vocab_size set). train: TrainConfig with every REQUIRED_TRAIN
    field set, precision in PRECISIONS, compile a bool, max_steps final. parallel: the layout of
    this world. requested_parallel: the parallel section as asked for (degrees -1 unresolved),
    which config.yaml keeps so that a resume re-resolves it for its own world size. layout: what
    it resolved to (world_size, dp, dp_replicate, dp_shard, tp, pp, zero_stage, device).
    budget_spent_s: probe seconds counted against train.max_minutes. compile_probe: the probe's
    figures, if it ran. Treat the three configs as read-only: nothing changes them after this.

    Raises:
        ValueError: a training field left unresolved (a bug in the caller, naming the field).
    """

    model: ModelConfig
    train: TrainConfig
    parallel: ParallelConfig
    requested_parallel: ParallelConfig
    layout: dict[str, Any]
    budget_spent_s: float = 0.0
    compile_probe: CompileProbe | None = None

    def __post_init__(self):
        tc = self.train
        unset = [n for n in REQUIRED_TRAIN if getattr(tc, n) is None]
        if unset or tc.precision not in PRECISIONS or not isinstance(tc.compile, bool) \
                or not isinstance(tc.document_mask, bool) or self.model.vocab_size is None:
            raise ValueError(f"ResolvedRun: unresolved fields {unset}, precision {tc.precision!r}, compile "
                             f"{tc.compile!r}, document_mask {tc.document_mask!r}, "
                             f"model.vocab_size {self.model.vocab_size!r}")

    @property
    def zero_stage(self) -> int:
        """The effective ZeRO stage of the layout."""
        return int(self.layout["zero_stage"])

    def config_yaml(self, data: dict[str, Any], extra: dict[str, Any] | None = None) -> str:
        """config.yaml's text: this run (with the requested parallel section), the data's
        provenance (`data`) and `extra` sections, plus `layout` (gptforge.train.provenance)."""
        from gptforge.train.provenance import run_config_yaml

        as_asked = RunConfig(model=self.model, train=self.train, parallel=self.requested_parallel)
        return run_config_yaml(as_asked, data, {"layout": dict(self.layout), **(extra or {})})


def pre_resolve(cfg: RunConfig, dp_size: int, vocab_size: int, precision: Precision, saved_train: dict | None = None,
                data_description: str = "the data") -> RunConfig:
    """Stage 1: the config the probes run on (model shape, batch, precision, size-aware lr).

    Args:
        cfg: the user's config. dp_size: data-parallel ranks. vocab_size: the data's vocabulary
            (meta.json's vocab_size). precision: train.precision as resolved. saved_train: as
            `Probes.saved_train`. data_description: names the data in errors.

    Returns: a RunConfig with model resolved (vocab_size from the data when unset), train with
    precision, global_batch_size, gradient_accumulation_steps, lr, min_lr and muon_lr set
    (warmup_steps still as given: it depends on the final max_steps).

    Raises:
        InputError: model.vocab_size below the data's, global_batch_size not a multiple of
            micro_batch_size x dp, or train.optimizer muon on a layout it cannot run on.
    """
    from gptforge.train.optim import check_muon_layout, resolve_lr_defaults

    mc = cfg.model
    if mc.vocab_size is None:
        mc = ModelConfig(**{**to_dict(mc), "vocab_size": int(vocab_size)})
    mc = mc.resolved()
    if mc.vocab_size < vocab_size:
        raise InputError(f"model.vocab_size={mc.vocab_size} is smaller than the data's vocabulary ({vocab_size}, "
                         f"{data_description}); leave model.vocab_size unset to take it from the data")
    tc = dataclasses.replace(cfg.train, precision=precision)
    if tc.global_batch_size is None:
        tc = dataclasses.replace(tc, global_batch_size=tc.micro_batch_size * tc.gradient_accumulation_steps * dp_size)
    else:
        per_step = tc.micro_batch_size * dp_size
        if tc.global_batch_size % per_step:
            raise InputError(f"train.global_batch_size {tc.global_batch_size} is not a multiple of "
                             f"train.micro_batch_size {tc.micro_batch_size} x {dp_size} data-parallel rank(s)")
        tc = dataclasses.replace(tc, gradient_accumulation_steps=tc.global_batch_size // per_step)
    check_muon_layout(tc, cfg.parallel)
    return RunConfig(model=mc, train=resolve_lr_defaults(mc, tc, saved_train), parallel=cfg.parallel)


def resolve_run(cfg: RunConfig, env, data, probes: Probes, requested_parallel: ParallelConfig | None = None,
                log: Callable[[str], None] | None = None) -> ResolvedRun:
    """Stage 2: the frozen run. Pure given its inputs (it measures nothing).

    Args:
        cfg: the user's config (parallel resolved for this world). env: the world (a DistEnv:
            dp_size, world_size, device). data: the data's facts (`vocab_size`, from meta.json,
            `description`, `source_tokens`: a BatchSource). probes: what the start-up probes found.
        requested_parallel: as `ResolvedRun.requested_parallel` (default cfg.parallel).
        log: receives one line per value chosen here (accumulation, time budget, size-aware
            defaults, the schedule).

    Returns: the ResolvedRun. max_steps: from train.max_minutes when `probes.step_seconds` is set
    (gptforge.train.budget.steps_for_minutes, after the probes' seconds); warmup_steps: the
    checkpoint's on resume, else 5% of max_steps (gptforge.train.optim.default_warmup).

    Raises:
        InputError: as `pre_resolve`.
    """
    from gptforge.train import budget
    from gptforge.train.optim import describe_defaults, describe_schedule, resolve_warmup_default

    say = log or (lambda m: None)
    user = cfg.train
    pre = pre_resolve(cfg, env.dp_size, int(data.vocab_size), probes.precision, probes.saved_train,
                      data.description)
    tc = dataclasses.replace(pre.train, compile=probes.compile)
    if tc.gradient_accumulation_steps != user.gradient_accumulation_steps:
        say(f"train.gradient_accumulation_steps {user.gradient_accumulation_steps} -> "
            f"{tc.gradient_accumulation_steps}: train.global_batch_size {tc.global_batch_size} on {env.dp_size} "
            "data-parallel rank(s)")
    if probes.step_seconds is not None:
        spent = probes.spent_seconds
        steps = budget.steps_for_minutes(tc.max_minutes, probes.step_seconds,
                                         eval_share=0.1 if tc.eval_interval > 0 else 0.0, spent_seconds=spent)
        replaced = (f" (replacing train.max_steps {tc.max_steps}: when train.max_minutes is set it decides "
                    "max_steps, an explicit one included; set max_minutes 0 to keep max_steps)"
                    if tc.max_steps != steps else "")
        left = max(0.0, tc.max_minutes * 60 - spent)
        say(f"train.max_minutes {tc.max_minutes:g}: {spent:.1f} s of start-up probes counted against it, "
            f"{left:.1f} s left for training; {probes.step_seconds:.3f} s/step ({probes.step_how}) -> "
            f"train.max_steps {steps}" + replaced)
        tc = dataclasses.replace(tc, max_steps=steps, max_minutes_steps=steps)
    tc = resolve_warmup_default(tc, probes.saved_train)
    tc = dataclasses.replace(tc, document_mask=resolve_document_mask(tc.document_mask, probes.saved_train))
    tc = resolve_mixture(tc, data.source_tokens, probes.saved_train, data.description, say,
                         probes.resume_step)
    line = describe_defaults(user, tc)
    if line:
        say(line)
    say(describe_schedule(tc))
    pc = pre.parallel
    layout = {"world_size": env.world_size, "dp": env.dp_size, "dp_replicate": pc.dp_replicate,
              "dp_shard": pc.dp_shard, "tp": pc.tp, "pp": pc.pp, "zero_stage": pc.effective_zero_stage(),
              "device": str(env.device)}
    return ResolvedRun(model=pre.model, train=tc, parallel=pc, requested_parallel=requested_parallel or pc,
                       layout=layout, budget_spent_s=probes.spent_seconds if probes.step_seconds is not None else 0.0,
                       compile_probe=probes.compile_probe)


def resolve_document_mask(asked: bool | None, saved_train: dict | None) -> bool:
    """train.document_mask as the run trains: as asked when set; unset, the resumed run's own
    value (its config.yaml), else False (bench/RESULTS.md: the mask did not win at the quickstart
    size, so it is off by default)."""
    if asked is not None:
        return bool(asked)
    return bool((saved_train or {}).get("document_mask") or False)


def resolve_mixture(tc: TrainConfig, source_tokens: dict[str, int] | None, saved_train: dict | None,
                    data_description: str = "the data", say: Callable[[str], None] = lambda m: None,
                    resume_step: int | None = None) -> TrainConfig:
    """train.data_weights and train.stages as the run trains.

    data_weights: as asked, else the resumed run's, else proportional to each source's train
    tokens (`source_tokens`); normalized to sum to 1 (gptforge.data.mixture.normalize_weights).
    stages: each until_fraction becomes until_step = round(fraction x max_steps); each stage's
    weights are normalized. With one source (`source_tokens` None) both stay None.

    On --resume at `resume_step` R with other weights or stages than the run's (as a changed
    train.schedule_start starts a fresh schedule at a chosen step), the change applies from step
    R on: the run's own weights of steps < R become stages ending at or before R (so the batches
    already drawn are drawn again alike), followed by the new stages that end after R; this is
    said and recorded in config.yaml.

    Raises:
        InputError: weights or stages for data of one source, a weight naming no source, a stage
            without exactly one of until_step / until_fraction, or stage ends that do not increase.
    """
    from gptforge.data.mixture import normalize_weights, proportional_weights

    saved = saved_train or {}
    if source_tokens is None:
        if tc.data_weights or tc.stages:
            raise InputError(f"train.data_weights / train.stages need a mixture (several --data folders, or a folder "
                             f"prepared with several --source); {data_description} is one source")
        return tc
    names = list(source_tokens)
    how = "as given" if tc.data_weights else "the run's own (--resume)" if saved.get("data_weights") else None
    try:
        weights = normalize_weights(dict(tc.data_weights or saved.get("data_weights")
                                         or proportional_weights(source_tokens)), names)
        stages = [_resolve_stage(i, st, tc.max_steps, names) for i, st in enumerate(tc.stages or saved.get("stages")
                                                                                       or [])]
    except ValueError as e:
        raise InputError(f"train.data_weights / train.stages: {e}") from None
    ends = [st["until_step"] for st in stages]
    if any(b <= a for a, b in pairwise(ends)) or any(e < 1 for e in ends):
        raise InputError(f"train.stages: stage ends {ends} (steps) must increase and be >= 1")
    if resume_step and saved.get("data_weights"):
        stages = _continue_mixture(saved, weights, stages, resume_step, say)
    given = tc.data_weights or {}
    if given and abs(sum(given.values()) - 1.0) > 1e-6:  # say what was given, not only the scaled weights
        how = "given as " + ", ".join(f"{n}={w:g}" for n, w in given.items()) + ", scaled to sum to 1"
    say("data mixture: " + ", ".join(f"{n} {w:.3f}" for n, w in weights.items())
        + f" ({how or 'proportional to train tokens'})"
        + "".join(f"; stage {i + 1} until step {st['until_step']}: "
                  + ", ".join(f"{n} {w:.3f}" for n, w in st["data_weights"].items()) for i, st in enumerate(stages)))
    return dataclasses.replace(tc, data_weights=weights, stages=stages or None)


def _continue_mixture(saved: dict, weights: dict, stages: list[dict], at: int, say) -> list[dict]:
    """The stages of a resume at step `at` whose weights or stages differ from the run's `saved`
    ones: the run's schedule before `at`, then `stages` ending after it (see resolve_mixture)."""
    def same(a: dict, b: dict) -> bool:
        return set(a) == set(b) and all(abs(float(a[k]) - float(b[k])) < 1e-12 for k in a)

    old_stages = saved.get("stages") or []
    old_w = saved["data_weights"]
    if same(old_w, weights) and len(old_stages) == len(stages) and all(
            a["until_step"] == b["until_step"] and same(a["data_weights"], b["data_weights"])
            for a, b in zip(old_stages, stages, strict=True)):
        return stages
    kept = [dict(st) for st in old_stages if st["until_step"] <= at]
    if at > (kept[-1]["until_step"] if kept else 0):
        current = next((st["data_weights"] for st in old_stages if at - 1 < st["until_step"]), old_w)
        kept.append({"until_step": at, "data_weights": dict(current)})
    merged = kept + [st for st in stages if st["until_step"] > at]
    say(f"--resume at step {at}: train.data_weights / train.stages differ from the run's; steps before {at} keep "
        f"the run's weights (recorded as stages ending by step {at} in config.yaml), the new ones apply from "
        f"step {at}")
    return merged


def _resolve_stage(i: int, stage: dict, max_steps: int, names: list[str]) -> dict:
    """One train.stages entry -> {until_step, data_weights (normalized)}; ValueError naming it."""
    from gptforge.data.mixture import normalize_weights

    unknown = set(stage) - {"until_step", "until_fraction", "data_weights"}
    if unknown or ("until_step" in stage) == ("until_fraction" in stage) or "data_weights" not in stage:
        raise ValueError(f"stage {i + 1} {stage}: give exactly one of until_step / until_fraction, and data_weights "
                         f"(no other key{', not ' + ', '.join(sorted(unknown)) if unknown else ''})")
    until = (int(stage["until_step"]) if "until_step" in stage
             else int(round(float(stage["until_fraction"]) * max_steps)))
    return {"until_step": until, "data_weights": normalize_weights(dict(stage["data_weights"]), names)}


def check_supported(cfg: RunConfig, env, deepspeed: bool) -> None:
    """Refuse, before anything is measured, combinations the trainer does not run: spike
    rollback outside a single process / plain DDP, fp16 without a gradient scaler's layout,
    train.document_mask under pipeline parallelism.

    Raises:
        InputError: naming the options and what to use instead.
    """
    tc, pc = cfg.train, cfg.parallel
    plain_ddp = pc.dp_shard == 1 and pc.tp == 1 and pc.pp == 1 and pc.effective_zero_stage() == 0
    if tc.spike_action == "rollback" and (deepspeed or (env.distributed and not plain_ddp)):
        raise InputError("train.spike_action=rollback runs in a single process or under plain DDP "
                         "(parallel.dp_replicate) only: its mid-run reload is not tested under FSDP2/ZeRO, tp, "
                         "pp or DeepSpeed; use train.spike_action warn there, and after a spike resume from an "
                         "earlier checkpoint by hand")
    if tc.document_mask and pc.pp > 1:
        raise InputError("train.document_mask does not run under pipeline parallelism (parallel.pp > 1): "
                         "its stages take no attention mask; turn one of them off")
    if tc.precision == "fp16" and not deepspeed and (pc.effective_zero_stage() in (2, 3) or pc.tp > 1 or pc.pp > 1):
        raise InputError("train.precision=fp16 needs a gradient scaler, which gptforge supports with a single "
                         "process, DDP and ZeRO-1 only; use bf16 with FSDP2/ZeRO-2/3, tp or pp")


def saved_train_section(run_dir: Path, resume: bool) -> dict | None:
    """The `train` section of the resumed checkpoint's config.yaml, or None for a new run."""
    if not resume:
        return None
    found = ckpt_lib.find_checkpoint(run_dir)
    return (yaml.safe_load((found / "config.yaml").read_text()) or {}).get("train") or {}


def resolve_training(cfg: RunConfig, env, data, run_dir: Path, resume: bool, log: Callable[[str], None],
                     deepspeed: bool = False, requested_parallel: ParallelConfig | None = None) -> ResolvedRun:
    """Both stages around the probes, for the trainer: precision (rank 0's choice), `pre_resolve`,
    the compile choice and the time budget on it, then `resolve_run`.

    On resume the checkpoint's frozen compile choice and lr / warmup values win; max_steps is kept
    when train.max_minutes_steps is already set. Every rank takes rank 0's precision and budget
    figures (ranks that timed differently would plan different runs).

    Raises:
        InputError: as `check_supported` and `pre_resolve`.
        ValueError: as `ModelConfig.resolved` (an unknown preset, inconsistent shapes), before the probes.
    """
    from gptforge.runtime.device import resolve_precision

    check_supported(cfg, env, deepspeed)
    # The model section first (an unknown preset, a bad shape): refused before any probe spends time.
    ModelConfig(**{**to_dict(cfg.model), "vocab_size": cfg.model.vocab_size or int(data.vocab_size)}).resolved()
    precision = env.rank0_value(resolve_precision(cfg.train.precision, env.device, log))
    saved = saved_train_section(run_dir, resume)
    resume_step = int(ckpt_lib.find_checkpoint(run_dir).name.removeprefix("step_")) if resume else None
    pre = pre_resolve(cfg, env.dp_size, int(data.vocab_size), precision, saved, data.description)
    chosen, probe = _probe_compile(pre, env, saved, log)
    pre = RunConfig(model=pre.model, train=dataclasses.replace(pre.train, compile=chosen), parallel=pre.parallel)
    step_s, how, spent = _probe_budget(pre, probe, env)
    probes = Probes(precision=precision, compile=chosen, compile_probe=probe, step_seconds=step_s, step_how=how,
                    spent_seconds=spent, saved_train=saved, resume_step=resume_step)
    return resolve_run(cfg, env, data, probes, requested_parallel, log)


def _probe_compile(pre: RunConfig, env, saved: dict | None, log) -> tuple[bool, CompileProbe | None]:
    """train.compile auto -> a bool (gptforge.train.compile_choice.resolve_compile: CUDA compiles,
    a CPU measures both for this shape); on resume the checkpoint's frozen value wins."""
    tc = pre.train
    if isinstance(tc.compile, bool):
        return tc.compile, None
    from gptforge.train.compile_choice import resolve_compile

    kept = (saved or {}).get("compile")
    if isinstance(kept, bool):
        return kept, None
    probes: list[CompileProbe] = []
    chosen = resolve_compile(tc.compile, pre.model, tc, tc.precision, env.device, log,
                             agree=env.all_reduce_sum if env.distributed else None, on_probe=probes.append,
                             whole=not env.distributed)
    return chosen, (probes[0] if probes else None)


def _probe_budget(pre: RunConfig, probe: CompileProbe | None, env) -> tuple[float | None, str, float]:
    """(step seconds, where from, probe seconds) for train.max_minutes, rank 0's on every rank;
    (None, "", 0.0) when there is no budget to plan (off, or resolved already). The step time is
    the compile probe's figure for the chosen side when it ran, else measured now
    (gptforge.train.budget.measure_step_seconds on the pre-resolved config)."""
    tc = pre.train
    if tc.max_minutes <= 0 or tc.max_minutes_steps:
        return None, "", 0.0
    from gptforge.train import budget

    side = "compiled" if tc.compile is True else "eager"
    if probe is not None:
        step_s = probe.compiled_s if tc.compile is True else probe.eager_s
        how, spent = f"{side}, from the compile probe", probe.total_s
    else:
        t0 = time.perf_counter()
        step_s = budget.measure_step_seconds(pre.model, tc, whole=not env.distributed)
        how, spent = f"{side}, measured", time.perf_counter() - t0
    step_s, spent, how = env.rank0_value((step_s, round(spent, 1), how))
    return step_s, how, spent
