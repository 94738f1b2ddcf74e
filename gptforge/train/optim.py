"""Optimizer construction and learning-rate schedules."""

from __future__ import annotations

import math
from typing import Any

import torch

from gptforge.config import TrainConfig

MUON_LR = 0.02
"""Default train.muon_lr (the reference Muon implementation's lr, Jordan et al. 2024)."""


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: decay on matrices (dim >= 2: linear and embedding weights), none on
    biases and norm weights (dim < 2). Shared (tied) parameters appear once.

    Following Loshchilov & Hutter 2019 (decoupled weight decay) and the GPT-2/nanoGPT practice of
    not decaying gains and biases. A group with no parameter is left out.
    """
    return _decay_groups(model.parameters(), weight_decay)


def _decay_groups(params, weight_decay: float) -> list[dict]:
    decay: list[torch.Tensor] = []
    no_decay: list[torch.Tensor] = []
    seen: set[int] = set()
    for p in params:
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # An empty group (e.g. LoRA trains matrices only) is left out; checkpoints cope with the empty
    # groups ZeRO-1 gives some ranks anyway (runtime.checkpoint._without_empty_groups).
    return [g for g in groups if g["params"]]


def require_resolved(cfg: TrainConfig, names=("lr",), where: str = "") -> None:
    """Refuse a TrainConfig whose `names` are unset: every default is filled once, by
    gptforge.train.resolve (`pre_resolve` for the start-up probes, `resolve_run` for the run).

    Raises:
        ValueError: naming the unset train.* fields and `where` they were needed.
    """
    unset = [n for n in names if getattr(cfg, n) is None]
    if unset:
        raise ValueError(f"{where or 'this'} needs a resolved config: train.{', train.'.join(unset)} unset; set "
                         "it, or resolve the run first (gptforge.train.resolve.pre_resolve / resolve_run)")


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, device_type: str,
                    zero_group=None) -> torch.optim.Optimizer:
    """AdamW (fused kernel on CUDA and CPU where this torch has it) or SGD with momentum 0.9.

    zero_group: a data-parallel process group for ZeRO-1: the optimizer becomes a
    `torch.distributed.optim.ZeroRedundancyOptimizer` that keeps on each rank the states of its
    share of the parameters only (Rajbhandari et al. 2020, ZeRO, section 5.1, P_os), updates that
    share and broadcasts it. Its `.optim` is the local optimizer (what checkpoints save).

    Raises:
        ValueError: an optimizer that only the planner models (adamw8bit, adafactor), or train.lr
            unset (`require_resolved`).
    """
    if cfg.optimizer == "muon":
        if zero_group is not None:
            raise ValueError("train.optimizer=muon does not run under ZeRO-1 (parallel.zero_stage 1): use DDP "
                             "(parallel.dp_replicate) or train.optimizer adamw")
        return build_muon(model, cfg, device_type)
    groups = param_groups(model, cfg.weight_decay)
    if cfg.optimizer == "adamw":
        cls: type[torch.optim.Optimizer] | None = torch.optim.AdamW
        kwargs: dict[str, Any] = dict(lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
        # Fused AdamW runs one kernel for all parameters; DTensor parameters (FSDP2/TP) use foreach.
        is_dtensor = any(type(p).__name__ == "DTensor" for g in groups for p in g["params"])
        if device_type in ("cuda", "cpu") and not is_dtensor:
            kwargs["fused"] = True
    elif cfg.optimizer == "sgd":
        cls, kwargs = torch.optim.SGD, dict(lr=cfg.lr, momentum=0.9)
    else:
        cls = None
    if cls is not None:
        require_resolved(cfg, ("lr",), "build_optimizer")
        if zero_group is not None:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            return ZeroRedundancyOptimizer(groups, optimizer_class=cls, process_group=zero_group, **kwargs)
        return cls(groups, **kwargs)
    raise ValueError(
        f"train.optimizer={cfg.optimizer!r} is modelled by `gptforge plan` but not trainable here; use adamw, sgd or muon"
    )


def check_muon_layout(train_cfg: TrainConfig, parallel_cfg) -> None:
    """Refuse train.optimizer muon, before anything is built, on a layout whose parameters are
    sharded (FSDP2: parallel.uses_fsdp(); tensor parallel: parallel.tp > 1), under ZeRO-1, or on
    the DeepSpeed backend; Newton-Schulz needs each whole matrix on one rank. No-op for other
    optimizers. parallel_cfg: a resolved ParallelConfig.

    Raises:
        InputError: naming the parallel option and what to use instead.
    """
    from gptforge.errors import InputError

    if train_cfg.optimizer != "muon":
        return
    why = None
    if parallel_cfg.backend == "deepspeed":
        why = "parallel.backend deepspeed runs AdamW only"
    elif parallel_cfg.tp > 1:
        why = f"parallel.tp={parallel_cfg.tp} shards the matrices"
    elif parallel_cfg.uses_fsdp():
        why = f"FSDP2 (parallel.dp_shard={parallel_cfg.dp_shard}, zero stage {parallel_cfg.effective_zero_stage()}) " \
              "holds sharded parameters"
    elif parallel_cfg.effective_zero_stage() == 1:
        why = "parallel.zero_stage 1 splits the optimizer over ranks"
    if why:
        raise InputError(f"train.optimizer=muon: {why}; Muon needs whole matrices per rank: use DDP "
                         "(parallel.dp_replicate), pipeline stages, or train.optimizer adamw")


def muon_split(model: torch.nn.Module) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    """(Muon parameters, AdamW parameters): Muon takes the weight of every nn.Linear inside the
    transformer blocks (a module path with a `blocks` component: q/k/v/o and MLP projections);
    AdamW everything else (token/position/value embeddings, the output head, norms, biases), as
    in Jordan et al. 2024 ("Muon: an optimizer for hidden layers"). Trainable parameters only,
    shared ones once."""
    muon_ids: set[int] = set()
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and "blocks" in name.split(".") and mod.weight.requires_grad \
                and mod.weight.dim() == 2:
            muon_ids.add(id(mod.weight))
    muon: list[torch.nn.Parameter] = []
    rest: list[torch.nn.Parameter] = []
    seen: set[int] = set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (muon if id(p) in muon_ids else rest).append(p)
    return muon, rest


class MuonAdamW(torch.optim.Optimizer):
    """torch.optim.Muon on the hidden matrices plus torch.optim.AdamW on the rest, as one optimizer.

    One `param_groups` list and one `state` (both inner optimizers share them), so the trainer's
    lr setting, zero_grad, gradient scaler, clipping and DCP checkpoints (`state_dict` /
    `load_state_dict`, resumed bit-exactly) treat it as any optimizer.

    Every group's "lr" is in AdamW units (what the schedule `lr_at` returns; the trainer sets it
    on all groups). A Muon group carries "muon_lr_ratio" = muon_lr / lr and steps with lr *
    ratio, so Muon follows the same schedule at its own peak. Groups: [muon], [adamw decay],
    [adamw no decay] (empty ones left out).

    Raises:
        ValueError: a sharded (DTensor: FSDP2 or tensor-parallel) parameter: Newton-Schulz on a
            shard is not the orthogonalised full matrix, so this refuses rather than produce
            wrong updates.
    """

    def __init__(self, muon_params, adamw_groups: list[dict], lr: float, muon_lr: float, momentum: float = 0.95,
                 muon_weight_decay: float = 0.0, betas=(0.9, 0.95), eps: float = 1e-8, fused: bool | None = None):
        muon_params, adamw_groups = list(muon_params), [g for g in adamw_groups if g["params"]]
        if any(type(p).__name__ == "DTensor" for p in muon_params) or \
                any(type(p).__name__ == "DTensor" for g in adamw_groups for p in g["params"]):
            raise ValueError("train.optimizer=muon cannot run on sharded parameters (FSDP2 / parallel.dp_shard > 1, "
                             "zero_stage 2-3, or parallel.tp > 1): Newton-Schulz needs whole matrices; use DDP "
                             "(parallel.dp_replicate) or train.optimizer adamw")
        if lr <= 0:
            raise ValueError(f"train.lr={lr!r}: Muon's lr is set relative to it, so it must be > 0")
        inner: list[torch.optim.Optimizer] = []
        if muon_params:
            self._muon = torch.optim.Muon(muon_params, lr=lr, weight_decay=muon_weight_decay, momentum=momentum,
                                          nesterov=True)
            for g in self._muon.param_groups:
                g["muon_lr_ratio"] = muon_lr / lr
            inner.append(self._muon)
        else:
            self._muon = None
        kwargs: dict[str, Any] = dict(lr=lr, betas=betas, eps=eps)
        if fused:
            kwargs["fused"] = True
        self._adamw = torch.optim.AdamW(adamw_groups, **kwargs) if adamw_groups else None
        if self._adamw is not None:
            inner.append(self._adamw)
        if not inner:
            raise ValueError("train.optimizer=muon: the model has no trainable parameter")
        super().__init__([g for o in inner for g in o.param_groups], defaults={})
        self._relink()

    def _relink(self) -> None:
        # The inner optimizers view slices of this one's groups and share its state dict.
        n = len(self._muon.param_groups) if self._muon is not None else 0
        if self._muon is not None:
            self._muon.param_groups = self.param_groups[:n]
            self._muon.state = self.state
        if self._adamw is not None:
            self._adamw.param_groups = self.param_groups[n:]
            self._adamw.state = self.state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._relink()

    @torch.no_grad()
    def step(self, closure=None):
        """One step of both optimizers; Muon groups at lr * muon_lr_ratio. Returns closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._muon is not None:
            saved = [g["lr"] for g in self._muon.param_groups]
            for g in self._muon.param_groups:
                g["lr"] = g["lr"] * g["muon_lr_ratio"]
            try:
                self._muon.step()
            finally:
                for g, lr in zip(self._muon.param_groups, saved, strict=True):
                    g["lr"] = lr
        if self._adamw is not None:
            self._adamw.step()
        return loss


def build_muon(model: torch.nn.Module, cfg: TrainConfig, device_type: str) -> MuonAdamW:
    """`MuonAdamW` for `model` from train.* (lr, muon_lr (default MUON_LR), muon_momentum,
    muon_weight_decay, weight_decay on the AdamW matrices, beta1/beta2/eps). Raises ValueError
    as `MuonAdamW`, or train.lr / train.muon_lr unset (`require_resolved`)."""
    require_resolved(cfg, ("lr",), "build_muon")
    if cfg.lr <= 0:
        raise ValueError(f"train.lr={cfg.lr!r}: Muon's lr is set relative to it, so it must be > 0")
    require_resolved(cfg, ("muon_lr",), "build_muon")
    muon, rest = muon_split(model)
    adamw_groups = _decay_groups(rest, cfg.weight_decay)
    return MuonAdamW(muon, adamw_groups, lr=cfg.lr, muon_lr=cfg.muon_lr,
                     momentum=cfg.muon_momentum, muon_weight_decay=cfg.muon_weight_decay,
                     betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                     fused=device_type in ("cuda", "cpu"))


# Size-aware defaults, fitted by bench/lr_sweep.py (bench/RESULTS.md, "Size-aware learning rate"):
# the best AdamW lr of 2-layer models on English prose at d_model 32/64/128/256 (300 steps of 512
# tokens) was 0.004/0.002/0.002/0.001; a least-squares line in log-log space gives
# lr = 0.0016 * (128 / d_model)^0.6. The exponent lies between muP's 1/width for Adam's hidden
# lr (Yang et al. 2022, table 3) and a constant; extrapolated to gpt2-small (d_model 768) it
# gives 5.5e-4, next to the 6e-4 GPT-3/nanoGPT use at that width (Brown et al. 2020, table 2.1).
LR_AT_128, LR_WIDTH_EXPONENT = 0.0016, 0.6
LR_MAX = 1e-2
WARMUP_FRACTION, WARMUP_MIN, WARMUP_MAX = 0.05, 10, 1000


def default_lr(d_model: int, max_steps: int) -> float:
    """The learning rate used when train.lr is unset: min(LR_MAX, LR_AT_128 * (128 /
    d_model)^LR_WIDTH_EXPONENT), rounded to 2 significant digits (d_model 64: 0.0024; 128:
    0.0016; 384: 0.00083; 768: 0.00055). max_steps: the planned run length; the sweep found the
    same best lr at 300 and 900 steps (d_model 32), so it only enters through the warmup
    (`default_warmup`)."""
    lr = min(LR_MAX, LR_AT_128 * (128 / d_model) ** LR_WIDTH_EXPONENT)
    return float(f"{lr:.2g}")


#: full fine-tuning's lr is the width rule's lr divided by this (LoRA / QLoRA take the rule's lr).
FULL_FINETUNE_LR_DIVISOR = 10.0


def finetune_lr(method: str, d_model: int) -> float:
    """The fine-tuning learning rate when train.lr is unset: `default_lr(d_model)` for LoRA and
    QLoRA (only the small adapter matrices move, from zero), that divided by
    FULL_FINETUNE_LR_DIVISOR for full fine-tuning (every pretrained weight moves). d_model 32:
    LoRA 0.0025, full 0.00025; 768 (GPT-2 small): 0.00055 / 5.5e-5; 4096 (7-8B): 0.0002 / 2e-5,
    the values commonly used for those sizes. Measured on gptforge-trained models in
    bench/finetune_lr.py (figures in bench/RESULTS.md)."""
    lr = default_lr(d_model, 0)
    return float(f"{lr / FULL_FINETUNE_LR_DIVISOR:.2g}") if method == "full" else lr


def finetune_lr_defaults(train_cfg: TrainConfig, method: str, d_model: int) -> TrainConfig:
    """A copy of `train_cfg` with an unset lr set by `finetune_lr(method, d_model)` (min_lr,
    muon_lr and warmup_steps are then filled by the run's resolver as for pretraining: lr / 10, and
    5% of max_steps, at most a quarter of the run)."""
    import dataclasses

    if train_cfg.lr is not None:
        return train_cfg
    return dataclasses.replace(train_cfg, lr=finetune_lr(method, d_model))


def default_warmup(max_steps: int) -> int:
    """Warmup steps when train.warmup_steps is unset: WARMUP_FRACTION (5%) of max_steps, clamped
    to [WARMUP_MIN, WARMUP_MAX] and to at most a quarter of the run."""
    w = min(WARMUP_MAX, max(WARMUP_MIN, round(WARMUP_FRACTION * max_steps)))
    return int(min(w, max_steps // 4))


def resolve_lr_defaults(model_cfg, train_cfg: TrainConfig, saved: dict | None = None) -> TrainConfig:
    """A copy of `train_cfg` with the unset values that depend on the model's width only filled:
    lr (`default_lr` of model.d_model), min_lr (lr / 10), muon_lr (MUON_LR). warmup_steps is
    left as it is (it depends on max_steps, which a time budget may still change).

    saved: the `train` section of the checkpoint's config.yaml when resuming; its values win
    over the rule for any field unset now (a resume with a longer max_steps keeps its lr).
    model_cfg: a ModelConfig (resolved or not).
    """
    import dataclasses

    saved = saved or {}
    d_model = model_cfg.resolved().d_model if model_cfg.d_model is None else model_cfg.d_model
    lr = train_cfg.lr if train_cfg.lr is not None else saved.get("lr")
    lr = float(lr) if lr is not None else default_lr(d_model, train_cfg.max_steps)
    min_lr = train_cfg.min_lr if train_cfg.min_lr is not None else saved.get("min_lr")
    muon_lr = train_cfg.muon_lr if train_cfg.muon_lr is not None else saved.get("muon_lr")
    return dataclasses.replace(train_cfg, lr=lr, min_lr=float(min_lr) if min_lr is not None else lr / 10,
                               muon_lr=float(muon_lr) if muon_lr is not None else MUON_LR)


def resolve_warmup_default(train_cfg: TrainConfig, saved: dict | None = None) -> TrainConfig:
    """A copy of `train_cfg` with an unset warmup_steps filled: the checkpoint's (`saved`, the
    `train` section of its config.yaml) on resume, else `default_warmup(max_steps)`."""
    import dataclasses

    warm = train_cfg.warmup_steps if train_cfg.warmup_steps is not None else (saved or {}).get("warmup_steps")
    return dataclasses.replace(train_cfg, warmup_steps=int(warm) if warm is not None
                               else default_warmup(train_cfg.max_steps))


def resolve_defaults(model_cfg, train_cfg: TrainConfig, saved: dict | None = None) -> TrainConfig:
    """A copy of `train_cfg` with every unset size-dependent value filled: lr, min_lr and
    muon_lr (`resolve_lr_defaults`), then warmup_steps (`resolve_warmup_default`) for
    train_cfg.max_steps. gptforge.train.resolve calls the two stages around the start-up probes;
    this is both at once, for a run whose max_steps is final. saved: as in `resolve_lr_defaults`.
    """
    return resolve_warmup_default(resolve_lr_defaults(model_cfg, train_cfg, saved), saved)


def describe_defaults(before: TrainConfig, after: TrainConfig) -> str:
    """One line naming the values `resolve_defaults` chose (those unset in `before`), e.g.
    "size-aware defaults: lr 0.0039, min_lr 0.00039, warmup_steps 50"; "" when nothing was unset."""
    chosen = [f"{k} {getattr(after, k):g}" for k in ("lr", "min_lr", "warmup_steps", "muon_lr")
              if getattr(before, k) is None and (k != "muon_lr" or after.optimizer == "muon")]
    return "size-aware defaults: " + ", ".join(chosen) if chosen else ""


def _schedule_fields(cfg: TrainConfig) -> tuple[str, ...]:
    """The train.* fields the schedule reads: min_lr only where it decays."""
    return ("lr", "warmup_steps") if cfg.lr_schedule == "constant" else ("lr", "min_lr", "warmup_steps")


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step `step` (0-based).

    The schedule runs over local steps s = max(0, step - schedule_start) of a span of
    n = max_steps - schedule_start steps (schedule_start 0: s = step, n = max_steps).
    Linear warmup from lr/warmup_steps to lr over `warmup_steps`, then:
    - cosine: min_lr + (lr - min_lr) * (1 + cos(pi * progress)) / 2 (Loshchilov & Hutter 2017);
    - linear: straight line from lr to min_lr;
    - constant: lr;
    - wsd (warmup-stable-decay, Hu et al. 2024, MiniCPM): lr until the last `decay_fraction` of
      the n steps, then linear to min_lr.
    progress = (s - warmup) / (n - warmup), clamped to [0, 1].

    Raises:
        ValueError: lr, warmup_steps or (a decaying schedule's) min_lr unset (`require_resolved`).
    """
    require_resolved(cfg, _schedule_fields(cfg), "lr_at")
    start = cfg.schedule_start
    step = max(0, step - start)
    n = max(1, cfg.max_steps - start)
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, n - cfg.warmup_steps)
    progress = min(1.0, max(0.0, (step - cfg.warmup_steps) / span))
    if cfg.lr_schedule == "constant":
        return cfg.lr
    if cfg.lr_schedule == "cosine":
        return cfg.min_lr + (cfg.lr - cfg.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if cfg.lr_schedule == "linear":
        return cfg.lr + (cfg.min_lr - cfg.lr) * progress
    if cfg.lr_schedule == "wsd":
        decay_steps = max(1, int(round(cfg.decay_fraction * n)))
        decay_start = n - decay_steps
        if step < decay_start:
            return cfg.lr
        return cfg.lr + (cfg.min_lr - cfg.lr) * min(1.0, (step - decay_start + 1) / decay_steps)
    raise ValueError(f"train.lr_schedule: unknown schedule {cfg.lr_schedule!r}")


def describe_schedule(cfg: TrainConfig) -> str:
    """One line naming the schedule that applies, for the run's log, e.g. "lr schedule: wsd from
    step 1000 to 1500 (warmup 0, decay over the last 100%), peak 0.0006 -> 6e-05". Raises
    ValueError as `lr_at` on an unresolved config."""
    require_resolved(cfg, _schedule_fields(cfg), "describe_schedule")
    tail = f", decay over the last {cfg.decay_fraction:.0%}" if cfg.lr_schedule == "wsd" else ""
    where = f"from step {cfg.schedule_start} to {cfg.max_steps}" if cfg.schedule_start else f"over {cfg.max_steps} steps"
    ends = f"{cfg.lr:g}" if cfg.lr_schedule == "constant" else f"{cfg.lr:g} -> {cfg.min_lr:g}"
    muon = f", muon peak {cfg.muon_lr:g}" if cfg.optimizer == "muon" else ""
    return f"lr schedule: {cfg.lr_schedule} {where} (warmup {cfg.warmup_steps}{tail}), peak {ends}{muon}"
