"""Who runs a step's backward, gradient synchronisation, clipping, optimizer step and checkpoints.

The training loop (`gptforge/train/run.py`) is the same for every engine: it reads the global
batch, divides each micro-batch's summed token loss by (global target count / dp), and logs. What
differs is delegated to one of two small objects with the same methods:

- `TorchBackend`: PyTorch's own machinery as laid out by `parallelize()` (one process, DDP,
  ZeRO-1 through `ZeroRedundancyOptimizer`, FSDP2 ZeRO-2/3, TP, PP); gptforge's AdamW, clipping by
  global norm, `torch.amp.GradScaler` for fp16; DCP checkpoints of model and optimizer.
- `DeepSpeedBackend`: DeepSpeed's engine (`deepspeed.initialize` with the translated DeepSpeed
  config): `engine.backward`, `engine.step`, DeepSpeed's ZeRO 1/2/3, its clipping
  (`gradient_clipping`), its fp16 loss scaler or bf16 master weights, its CPU offload; DeepSpeed's
  own checkpoint inside gptforge's atomic step folder, beside a DCP copy of the fp32 weights.

Per optimizer step the loop calls: `set_lr`; for every micro-batch `grad_sync(is_last)` (a
context) and `backward(loss, is_last)`; then `clip(max_norm)` -> grad norm before clipping, and
`step(finite)` -> whether the update was skipped.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import torch

from gptforge.runtime import checkpoint as ckpt_lib
from gptforge.train.parallel import distributed as D

DEEPSPEED_DIR = "deepspeed"
"""Sub-folder of a step folder holding DeepSpeed's own checkpoint (its `tag`)."""


class TorchBackend:
    """PyTorch's own engine: the model laid out by `parallelize()` and gptforge's optimizer.

    Args:
        par: the `Parallelized` model. optimizer: what `build_optimizer` returned (a
            ZeroRedundancyOptimizer under ZeRO-1). scaler: a GradScaler for fp16, else None.
        env: the DistEnv. precision: train.precision (autocast dtype of forward passes).
    """

    name = "torch"

    def __init__(self, par, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None,
                 env: D.DistEnv, precision: str):
        self.par = par
        self.optimizer = optimizer
        # ZeRO-1 checkpoints the rank's local optimizer (its share of the states).
        self.state_optimizer = optimizer.optim if hasattr(optimizer, "optim") else optimizer
        self.scaler = scaler
        self.env = env
        self.autocast_precision = precision
        self.params = [p for p in par.core.parameters() if p.requires_grad]
        self.loss_scale: float | None = None
        """The fp16 loss scale the last step's backward used (None without a scaler)."""

    @property
    def module(self) -> torch.nn.Module | None:
        """What forward passes call (None under pipeline parallelism: the schedule runs it)."""
        return self.par.module

    @property
    def has_loss_scaler(self) -> bool:
        return self.scaler is not None

    def set_lr(self, lr: float) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    def grad_sync(self, is_last: bool):
        return self.par.grad_sync(is_last) if self.env.distributed else contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, is_last: bool) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def clip(self, max_norm: float) -> float:
        """Unscale (fp16), clip to a global L2 norm of max_norm (inf: no clipping); returns the
        norm before clipping."""
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self.env.distributed:
            return D.clip_grad_norm(self.params, max_norm, self.env)
        return float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))

    def step(self, finite: bool) -> bool:
        """Optimizer step unless the loss or gradient norm is not finite (under fp16 the scaler
        decides). Returns True when the step counts as skipped."""
        if self.scaler is not None:
            # The scale this step's gradients were multiplied by (update() below changes it).
            self.loss_scale = float(self.scaler.get_scale())
            self.scaler.step(self.optimizer)  # skips the step itself on inf/nan gradients
            self.scaler.update()
        elif finite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return not finite

    def save(self, ckpt_root: Path, step: int, trainer_state: dict[str, Any], config_yaml: str, keep: int,
             best: bool) -> Path:
        st = dict(trainer_state, scaler=self.scaler.state_dict() if self.scaler is not None else None)
        return ckpt_lib.save_checkpoint(ckpt_root, step, self.par.core, self.state_optimizer, st, config_yaml,
                                        keep=keep, mark_best=best)

    def load(self, ckpt: Path) -> dict[str, Any]:
        """Load model + optimizer (any layout's DCP checkpoint) and this rank's RNG state.

        Raises:
            ValueError: the checkpoint was written by the DeepSpeed backend (its optimizer state is
                DeepSpeed's own); resume it with --backend deepspeed.
        """
        if (Path(ckpt) / DEEPSPEED_DIR).is_dir():
            raise ValueError(f"--resume: {ckpt} was written by the DeepSpeed backend (its optimizer state is in "
                             f"{DEEPSPEED_DIR}/); resume with --backend deepspeed and the same ZeRO stage, or start a "
                             "new run from its weights (`gptforge export-checkpoint` reads them)")
        state = ckpt_lib.load_checkpoint(ckpt, self.par.core, self.state_optimizer)
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        return state


def deepspeed_available() -> bool:
    """True when `import deepspeed` works here."""
    try:
        import deepspeed  # noqa: F401
    except Exception:  # ImportError, or a broken build failing at import
        return False
    return True


class DeepSpeedBackend:
    """DeepSpeed's engine on a GPT: ZeRO 1/2/3, CPU offload, fp16/bf16 as its config says.

    Built with `deepspeed.initialize(model, model_parameters=gptforge's two AdamW groups (decay on
    matrices only), config=the translated DeepSpeed config)`; the optimizer is the config's AdamW
    (DeepSpeed picks its implementation: FusedAdam, DeepSpeedCPUAdam under offload_optimizer, or
    torch.optim.AdamW with `"torch_adam": true`).

    Loss normalisation: the loop passes sum(token losses) / (global target tokens / dp), as for DDP.
    `engine.backward(loss, scale_wrt_gas=False)` stops DeepSpeed from dividing again by
    gradient_accumulation_steps; DeepSpeed's data-parallel reduction averages gradients over the
    dp ranks (divides by dp), which the divisor already accounts for. The resulting gradient is
    that of sum(token losses) / global target tokens, the same as every other layout.

    Accumulation: DeepSpeed counts micro-batches itself; `engine.step()` is called after every
    micro-batch's backward and updates the weights only at the gradient_accumulation_steps
    boundary (it reduces gradients there, or bucket by bucket under ZeRO-2/3). Clipping and the
    skip decision (fp16 overflow) happen inside that boundary step; `clip()` then reports
    DeepSpeed's global gradient norm (before clipping).

    Precision: with fp16/bf16 enabled DeepSpeed holds the module in that dtype and keeps fp32
    master weights in the ZeRO optimizer, so forward passes run without torch.autocast.

    Raises (constructor):
        ImportError: DeepSpeed is not installed (`pip install gptforge[deepspeed]`).
        RuntimeError: DeepSpeed failed to compile a C++ extension on its first run (no g++/ninja).
    """

    name = "deepspeed"

    def __init__(self, model: torch.nn.Module, ds_config: dict, weight_decay: float, env: D.DistEnv):
        try:
            import deepspeed
        except ImportError as e:
            raise ImportError(f"parallel.backend=deepspeed needs DeepSpeed ({e}); install it with "
                              "`pip install gptforge[deepspeed]` (on a CPU-only machine: DS_BUILD_OPS=0)") from e
        from gptforge.train.optim import param_groups

        # DeepSpeed logs every step and its whole config at INFO; gptforge's progress bar and
        # metrics already say this. Warnings and errors still show.
        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        self.env = env
        self.config = ds_config
        # DeepSpeed asserts LOCAL_RANK is set (launchers set it); a run without a launcher is rank 0.
        os.environ.setdefault("LOCAL_RANK", str(env.local_rank))
        model.to(env.device)
        groups = param_groups(model, weight_decay)
        try:
            self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=groups,
                                                                     config=ds_config)
        except RuntimeError as e:
            if "Error building extension" not in str(e):
                raise
            raise RuntimeError(
                "DeepSpeed could not compile one of its C++ extensions, which it builds on the first run on a "
                "machine (deepspeed_shm_comm; fused_adam, or cpu_adam under offload_optimizer): it needs a C++ "
                "compiler (g++) and ninja on PATH; the results are cached in TORCH_EXTENSIONS_DIR "
                f"(default ~/.cache/torch_extensions). Build error: {str(e).splitlines()[0][:500]}") from e
        self.zero_stage = int(self.engine.zero_optimization_stage())
        self.autocast_precision = "fp32"
        self._skipped_before = 0
        self._norm_before_step = float("nan")
        self._scale_used: float | None = None

    @property
    def module(self) -> torch.nn.Module:
        return self.engine

    @property
    def core(self) -> torch.nn.Module:
        """The GPT itself (parameters partitioned under ZeRO-3)."""
        return self.engine.module

    @property
    def has_loss_scaler(self) -> bool:
        return bool(self.engine.fp16_enabled())

    def set_lr(self, lr: float) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    def grad_sync(self, is_last: bool):
        # DeepSpeed decides when to reduce from its own micro-step counter.
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, is_last: bool) -> None:
        if is_last:
            self._skipped_before = self.engine.skipped_steps
            scale = getattr(self.engine.optimizer, "cur_scale", None) if self.has_loss_scaler else None
            self._scale_used = float(scale) if scale is not None else None  # engine.step() may change it
        self.engine.backward(loss, scale_wrt_gas=False)
        if is_last and self.zero_stage == 0:
            # Without ZeRO, DeepSpeed's fp32 step does not record the norm: take it from the
            # reduced, still unclipped gradients before the step clears them.
            grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
            self._norm_before_step = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
        self.engine.step()  # an update only at the accumulation boundary (the last micro-batch)

    def clip(self, max_norm: float) -> float:
        """DeepSpeed's global gradient norm before its own clipping (done inside engine.step with
        the config's gradient_clipping; max_norm is the same number, see translate())."""
        norm = self.engine.get_global_grad_norm()
        if norm is None:
            return self._norm_before_step
        return float(norm)

    def step(self, finite: bool) -> bool:
        """The update already ran inside engine.step(); returns whether DeepSpeed skipped it
        (fp16 overflow) or the loss/norm was not finite."""
        return self.engine.skipped_steps > self._skipped_before or not finite

    @property
    def loss_scale(self) -> float | None:
        """The fp16 loss scale (DeepSpeed's optimizer's `cur_scale`) the last step's backward used,
        read before its engine.step(); None without fp16."""
        return self._scale_used

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The GPT's state dict with full fp32 tensors (the master weights under fp16/bf16 and
        ZeRO), on rank 0; an empty dict on other ranks. A collective under ZeRO-3: every rank
        must call it."""
        from deepspeed.utils import safe_get_full_fp32_param

        module = self.engine.module
        by_id = {}
        for _, p in module.named_parameters():
            if id(p) not in by_id:
                full = safe_get_full_fp32_param(p)
                by_id[id(p)] = (full if full is not None else p.detach()).detach().float().cpu()
        names = dict(module.named_parameters(remove_duplicate=False))
        out: dict[str, torch.Tensor] = {}
        for k, v in module.state_dict().items():
            # Activation checkpointing and torch.compile wrap blocks; the GPT's own names are kept.
            name = k.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")
            out[name] = by_id[id(names[k])] if k in names else v.detach().cpu()
        return out if self.env.rank == 0 else {}

    def save(self, ckpt_root: Path, step: int, trainer_state: dict[str, Any], config_yaml: str, keep: int,
             best: bool) -> Path:
        """DeepSpeed's own checkpoint (module, ZeRO-partitioned optimizer states, engine counters)
        in `<step folder>/deepspeed/`, plus the full fp32 weights as DCP beside it (so evaluate,
        generate and export-checkpoint read a DeepSpeed run like any other), written through the
        same temp folder, rename and `latest` pointer as every checkpoint."""
        def write_engine(tmp: Path) -> None:
            self.engine.save_checkpoint(str(tmp), tag=DEEPSPEED_DIR, save_latest=False)

        return ckpt_lib.save_checkpoint(ckpt_root, step, self.engine.module, None, trainer_state, config_yaml,
                                        keep=keep, mark_best=best, model_state=self.full_state_dict(),
                                        extra=write_engine, consolidated=True)  # optimizer in deepspeed/

    def load(self, ckpt: Path) -> dict[str, Any]:
        """Restore the engine from `<ckpt>/deepspeed/` and this rank's RNG state.

        Raises:
            ValueError: the checkpoint has no DeepSpeed state (written by the torch backend), or was
                written by another number of processes or ZeRO stage (DeepSpeed cannot repartition
                ZeRO optimizer states on load).
        """
        ckpt = Path(ckpt)
        if not (ckpt / DEEPSPEED_DIR).is_dir():
            raise ValueError(f"--resume: {ckpt} has no {DEEPSPEED_DIR}/ folder: it was written by the torch backend; "
                             "resume it with --backend torch (parallel.zero_stage/offload give the same ZeRO stages)")
        import yaml

        saved = (yaml.safe_load((ckpt / "config.yaml").read_text()) or {}).get("layout") or {}
        if saved.get("world_size", self.env.world_size) != self.env.world_size or \
                saved.get("zero_stage", self.zero_stage) != self.zero_stage:
            raise ValueError(
                f"--resume: {ckpt} holds DeepSpeed ZeRO-{saved.get('zero_stage')} optimizer partitions of "
                f"{saved.get('world_size')} processes; this run has {self.env.world_size} processes at ZeRO-"
                f"{self.zero_stage}, and DeepSpeed reloads ZeRO partitions only unchanged. Resume with the saved "
                "process count and stage, or convert the folder with DeepSpeed's "
                "`python -m deepspeed.checkpoint.ds_to_universal` and load that through DeepSpeed yourself")
        path, _ = self.engine.load_checkpoint(str(ckpt), tag=DEEPSPEED_DIR, load_optimizer_states=True,
                                              load_lr_scheduler_states=False)
        if path is None:
            raise ValueError(f"--resume: DeepSpeed could not load {ckpt / DEEPSPEED_DIR}")
        state = ckpt_lib.load_trainer_state(ckpt)
        ckpt_lib.restore_rng(state)
        return state
