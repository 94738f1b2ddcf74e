"""Translate a DeepSpeed JSON config to and from gptforge's config, reporting conflicts.

The DeepSpeed file and gptforge's own config describe the same run; where both say something
about the same setting, they must agree. A gptforge field counts as "set" when it differs from
its default; a set field that disagrees with the file is an error naming both places. A field at
its default takes the file's value. Keys the file lacks are filled from gptforge's config, so the
engine and gptforge's schedule, logging and planner see one set of numbers.

Keys understood (DeepSpeed names, https://www.deepspeed.ai/docs/config-json/):
train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps,
gradient_clipping, optimizer {type AdamW/Adam, params lr, betas, eps, weight_decay},
fp16.enabled, bf16.enabled, zero_optimization {stage 0-3, offload_optimizer.device,
offload_param.device}. `scheduler` is refused: the learning-rate schedule is train.lr_schedule.
Other keys pass through to DeepSpeed unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

from gptforge.config import ParallelConfig, RunConfig, TrainConfig

_TRAIN_DEFAULTS = TrainConfig()
_PARALLEL_DEFAULTS = ParallelConfig()


def load_ds_config(path: str | Path) -> dict:
    """Read a DeepSpeed JSON config.

    Raises:
        FileNotFoundError: missing file. ValueError: not a JSON object (with the position).
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"parallel.deepspeed_config: {p} does not exist")
    try:
        doc = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{p}: a DeepSpeed config is a JSON object, got {type(doc).__name__}")
    return doc


class _Merge:
    """Collects conflicts between the file and gptforge's fields."""

    def __init__(self, cfg: RunConfig, source: str):
        self.train = dataclasses.asdict(cfg.train)
        self.parallel = dataclasses.asdict(cfg.parallel)
        self.source = source
        self.conflicts: list[str] = []

    def take(self, section: str, field: str, ds_key: str, ds_value: Any, ours_as_ds=lambda v: v,
             ds_as_ours=lambda v: v) -> None:
        values = self.train if section == "train" else self.parallel
        default = getattr(_TRAIN_DEFAULTS if section == "train" else _PARALLEL_DEFAULTS, field)
        ours = values[field]
        if ours != default and ours_as_ds(ours) != ds_value:
            self.conflicts.append(f"{self.source}: {ds_key} = {ds_value!r} but {section}.{field} = {ours!r}")
        elif ours == default:
            values[field] = ds_as_ours(ds_value)


def translate(ds: dict, cfg: RunConfig, world_size: int, source: str = "deepspeed config") -> tuple[RunConfig, dict]:
    """Merge a DeepSpeed config with gptforge's.

    Args:
        ds: the DeepSpeed config (a dict from JSON). cfg: gptforge's config. world_size: number of
            processes (all data parallel under DeepSpeed here).

    Returns: (gptforge RunConfig with the file's values filled in, complete DeepSpeed config).

    Raises:
        ValueError: every conflict at once, one per line, naming the file key and the gptforge
            field; or keys gptforge cannot honour (scheduler, other optimizers, fp16 and bf16 both).
    """
    m = _Merge(cfg, source)
    errors: list[str] = []
    if "scheduler" in ds:
        errors.append(f"{source}: `scheduler` is not used: gptforge sets the learning rate every step from "
                      "train.lr_schedule/train.warmup_steps/train.min_lr; remove it from the file")
    if cfg.parallel.tp > 1 or cfg.parallel.pp > 1:
        errors.append("parallel.backend=deepspeed runs data parallel (ZeRO) only: set parallel.tp and parallel.pp to 1")
    if "train_micro_batch_size_per_gpu" in ds:
        m.take("train", "micro_batch_size", "train_micro_batch_size_per_gpu", ds["train_micro_batch_size_per_gpu"])
    if "gradient_accumulation_steps" in ds:
        m.take("train", "gradient_accumulation_steps", "gradient_accumulation_steps", ds["gradient_accumulation_steps"])
    if "gradient_clipping" in ds:
        m.take("train", "grad_clip", "gradient_clipping", float(ds["gradient_clipping"]))
    _take_optimizer(m, ds.get("optimizer"), source, errors)
    _take_precision_and_zero(m, ds, source, errors)
    train_cfg = TrainConfig(**m.train)
    par_cfg = ParallelConfig(**m.parallel)
    dp = world_size
    gbs = train_cfg.micro_batch_size * train_cfg.gradient_accumulation_steps * dp
    errors += _check_merged(ds, train_cfg, par_cfg, gbs, dp, source)
    problems = m.conflicts + errors
    if problems:
        raise ValueError("the DeepSpeed config and gptforge's config disagree:\n  " + "\n  ".join(problems))

    out = _deepspeed_config(ds, train_cfg, par_cfg, gbs)
    return RunConfig(model=cfg.model, train=train_cfg, parallel=par_cfg), out


def _take_optimizer(m: _Merge, opt: dict | None, source: str, errors: list[str]) -> None:
    """The file's optimizer section: AdamW only; lr, betas, eps and weight decay merged."""
    if opt is None:
        return
    kind = str(opt.get("type", "")).lower()
    if kind not in ("adamw", "adam"):
        errors.append(f"{source}: optimizer.type {opt.get('type')!r} is not supported; use AdamW")
    elif kind == "adam" and opt.get("params", {}).get("adam_w_mode") is False:
        errors.append(f"{source}: optimizer Adam with adam_w_mode false (L2, not decoupled decay) is not "
                      "gptforge's AdamW; set adam_w_mode true or type AdamW")
    params = opt.get("params", {})
    if "lr" in params:
        m.take("train", "lr", "optimizer.params.lr", float(params["lr"]))
    if "betas" in params:
        betas = [float(b) for b in params["betas"]]
        m.take("train", "beta1", "optimizer.params.betas[0]", betas[0])
        m.take("train", "beta2", "optimizer.params.betas[1]", betas[1])
    if "eps" in params:
        m.take("train", "eps", "optimizer.params.eps", float(params["eps"]))
    if "weight_decay" in params:
        m.take("train", "weight_decay", "optimizer.params.weight_decay", float(params["weight_decay"]))


def _take_precision_and_zero(m: _Merge, ds: dict, source: str, errors: list[str]) -> None:
    """The file's fp16/bf16 and zero_optimization sections (stage, CPU offload)."""
    fp16 = bool(ds.get("fp16", {}).get("enabled", False))
    bf16 = bool(ds.get("bf16", {}).get("enabled", False))
    if fp16 and bf16:
        errors.append(f"{source}: fp16.enabled and bf16.enabled are both true; choose one")
    elif fp16 or bf16 or "fp16" in ds or "bf16" in ds:
        m.take("train", "precision", "fp16.enabled/bf16.enabled", "fp16" if fp16 else "bf16" if bf16 else "fp32")
    zo = ds.get("zero_optimization")
    if zo is not None:
        stage = int(zo.get("stage", 0))
        m.take("parallel", "zero_stage", "zero_optimization.stage", stage)
        off_opt = (zo.get("offload_optimizer") or {}).get("device", "none")
        off_par = (zo.get("offload_param") or {}).get("device", "none")
        for key, dev in (("offload_optimizer", off_opt), ("offload_param", off_par)):
            if dev not in ("none", "cpu"):
                errors.append(f"{source}: zero_optimization.{key}.device {dev!r}: gptforge supports cpu or none")
        if off_par == "cpu" and stage != 3:
            errors.append(f"{source}: zero_optimization.offload_param needs stage 3 (got stage {stage})")
        offload = "optimizer+params" if off_par == "cpu" else "optimizer" if off_opt == "cpu" else "none"
        m.take("parallel", "offload", "zero_optimization.offload_*", offload)


def _check_merged(ds: dict, train_cfg: TrainConfig, par_cfg: ParallelConfig, gbs: int, dp: int,
                  source: str) -> list[str]:
    """What the merged configs cannot run together, one message each."""
    errors: list[str] = []
    if "train_batch_size" in ds and int(ds["train_batch_size"]) != gbs:
        errors.append(f"{source}: train_batch_size = {ds['train_batch_size']} but train.micro_batch_size "
                      f"{train_cfg.micro_batch_size} x train.gradient_accumulation_steps "
                      f"{train_cfg.gradient_accumulation_steps} x {dp} processes = {gbs}")
    if par_cfg.offload != "none" and par_cfg.zero_stage == 0:
        errors.append("parallel.offload needs a ZeRO stage: set zero_optimization.stage (or parallel.zero_stage)")
    if train_cfg.precision in ("fp16", "bf16") and par_cfg.zero_stage == 0:
        # Measured on the CPU: DeepSpeed's non-ZeRO fp16/bf16 optimizer wrappers drifted from the
        # fp32 run by 0.1-0.4 % in loss within 5 steps, where ZeRO 1-3 stay within 5e-5.
        errors.append(f"train.precision={train_cfg.precision} under the DeepSpeed backend needs "
                      "zero_optimization.stage 1, 2 or 3 (fp32 master weights in DeepSpeed's ZeRO optimizer); "
                      "stage 0 is accepted for fp32 only")
    if train_cfg.optimizer != "adamw":
        errors.append(f"train.optimizer={train_cfg.optimizer!r}: the DeepSpeed backend runs AdamW")
    return errors


def _train_keys(ds: dict, train_cfg: TrainConfig, gbs: int) -> dict:
    """A copy of `ds` with the keys gptforge's train section decides: batch, clipping, AdamW's
    params, fp16/bf16. optimizer.params.lr is left out while train.lr is unset (before the run is
    resolved; `resolved_deepspeed_config` then writes the resolved one)."""
    out = copy.deepcopy(ds)
    out["train_micro_batch_size_per_gpu"] = train_cfg.micro_batch_size
    out["gradient_accumulation_steps"] = train_cfg.gradient_accumulation_steps
    out["train_batch_size"] = gbs
    out["gradient_clipping"] = train_cfg.grad_clip
    params = {k: v for k, v in (ds.get("optimizer", {}).get("params", {})).items() if k != "lr"}
    lr = {"lr": train_cfg.lr} if train_cfg.lr is not None else {}
    out["optimizer"] = {"type": "AdamW", "params": {
        **params, **lr, "betas": [train_cfg.beta1, train_cfg.beta2], "eps": train_cfg.eps,
        "weight_decay": train_cfg.weight_decay}}
    out["fp16"] = {**ds.get("fp16", {}), "enabled": train_cfg.precision == "fp16"}
    out["bf16"] = {**ds.get("bf16", {}), "enabled": train_cfg.precision == "bf16"}
    return out


def resolved_deepspeed_config(ds: dict, train_cfg: TrainConfig, dp_size: int) -> dict:
    """The JSON `deepspeed.initialize` gets: `ds` (what `translate` returned) with the resolved
    run's values (a ResolvedRun's train: lr, batch, accumulation, clipping, precision) for
    `dp_size` data-parallel processes, so the engine's optimizer starts at config.yaml's lr.

    Raises:
        ValueError: train.lr unset (not a resolved config).
    """
    if train_cfg.lr is None:
        raise ValueError("resolved_deepspeed_config needs a resolved train config (train.lr unset); see "
                         "gptforge.train.resolve")
    gbs = train_cfg.micro_batch_size * train_cfg.gradient_accumulation_steps * dp_size
    return _train_keys(ds, train_cfg, gbs)


def _deepspeed_config(ds: dict, train_cfg: TrainConfig, par_cfg: ParallelConfig, gbs: int) -> dict:
    """The complete config for deepspeed.initialize: the file's keys with gptforge's values."""
    out = _train_keys(ds, train_cfg, gbs)
    zo_out = dict(ds.get("zero_optimization", {}))
    zo_out["stage"] = par_cfg.zero_stage
    if par_cfg.offload in ("optimizer", "optimizer+params"):
        zo_out["offload_optimizer"] = {**zo_out.get("offload_optimizer", {}), "device": "cpu"}
    if par_cfg.offload == "optimizer+params":
        zo_out["offload_param"] = {**zo_out.get("offload_param", {}), "device": "cpu"}
    out["zero_optimization"] = zo_out
    return out


def deepspeed_run_config(cfg: RunConfig, world_size: int) -> tuple[RunConfig, dict, ParallelConfig]:
    """Everything `train()` needs to run the DeepSpeed backend on `world_size` processes.

    Reads `parallel.deepspeed_config`, merges it with gptforge's config (see `translate`) and
    describes the process layout: under DeepSpeed every process is a data-parallel rank (ZeRO
    shards over all of them).

    Returns: (the merged RunConfig, the complete DeepSpeed config for `deepspeed.initialize`,
    the ParallelConfig of the process group and mesh: dp_replicate = world_size).

    Raises:
        ValueError: no config file given, conflicts (all listed), or parallel.dp_replicate/dp_shard
            set to something other than the number of processes.
        FileNotFoundError: the config file does not exist.
    """
    pc = cfg.parallel.resolved(world_size)
    if not pc.deepspeed_config:
        raise ValueError("parallel.backend=deepspeed needs parallel.deepspeed_config (a DeepSpeed JSON file); "
                         "pass --deepspeed-config ds_config.json")
    if pc.dp not in (1, world_size):
        raise ValueError(f"parallel.backend=deepspeed: every process is a data-parallel rank, but "
                         f"parallel.dp_replicate {pc.dp_replicate} x parallel.dp_shard {pc.dp_shard} = {pc.dp} and this job has {world_size} "
                         "processes; leave both at 1")
    merged, ds = translate(load_ds_config(pc.deepspeed_config), cfg, world_size, source=str(pc.deepspeed_config))
    env_pc = ParallelConfig(dp_replicate=world_size, dp_shard=1, timeout_minutes=pc.timeout_minutes)
    return merged, ds, env_pc
