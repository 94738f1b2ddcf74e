"""One optimizer step's forward and backward, for a plain module and through a pipeline schedule.

Per optimizer step: `gradient_accumulation_steps` micro-batches under autocast; each micro-batch's
summed token loss is divided by the number of target tokens of the whole optimizer step, so the
update equals one big batch's mean-over-tokens loss, not a mean of micro-batch means.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import numpy as np
import torch

from gptforge.data.loader import TokenStream
from gptforge.runtime.device import autocast_context
from gptforge.runtime.loss import IGNORE_INDEX, token_loss_sum, unpack_micro_batch
from gptforge.runtime.onednn_linear import onednn_linear
from gptforge.train.parallel.parallelize import Parallelized


def forward_backward(model: torch.nn.Module, micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
                     loss_divisor: float, device: torch.device, precision: str = "fp32",
                     scaler: torch.amp.GradScaler | None = None,
                     grad_sync: Callable[[bool], Any] | None = None,
                     backward: Callable[[torch.Tensor, bool], None] | None = None,
                     loss_fn: Callable[..., torch.Tensor] | None = None,
                     use_onednn_linear: bool = False) -> torch.Tensor:
    """Accumulate gradients of sum(token losses) / loss_divisor over the micro-batches.

    With loss_divisor = the step's total target-token count, the accumulated gradient equals that
    of the mean token loss of one batch holding all micro-batches, however the target tokens are
    spread across micro-batches (a mean of micro-batch means would weight them unequally).
    Each micro-batch is (inputs (b, T), targets (b, T)) int64, or a dict (see
    `unpack_micro_batch`); targets -100 are ignored.

    Data parallel: pass loss_divisor = (global target count over all dp ranks) / dp, because DDP
    and FSDP2 average gradients over the dp ranks; `grad_sync(is_last)` gives the context of each
    backward (gradients are reduced across ranks on the last micro-batch only).
    `loss_fn(logits, targets, inputs, extra)` replaces the summed token loss (e.g. distillation's
    T^2 KL + alpha CE, gptforge.train.workflows.distill.DistillLoss): same units, summed over counted targets.
    `backward(loss, is_last)` replaces `loss.backward()` (a backend's, e.g. DeepSpeed's engine).
    `use_onednn_linear`: forward and backward inside `gptforge.runtime.onednn_linear.onednn_linear`
    (only fp32 CPU linear layers change; pass it for eager steps only, see `onednn_linear_for`).

    Returns: this rank's summed token loss in nats (0-dim, detached), for logging.
    """
    loss_sum = torch.zeros((), device=device)
    n = len(micro_batches)
    for i, mb in enumerate(micro_batches):
        x, y, extra = unpack_micro_batch(mb)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        extra = {k: v.to(device, non_blocking=True) for k, v in extra.items()}
        with (grad_sync(i == n - 1) if grad_sync is not None else contextlib.nullcontext(),
              onednn_linear(use_onednn_linear)):
            with autocast_context(device, precision):
                logits = model(x, **extra)
            ls = token_loss_sum(logits, y) if loss_fn is None else loss_fn(logits, y, x, extra)
            scaled = ls / max(loss_divisor, 1e-12) if loss_divisor > 0 else ls
            if backward is not None:
                backward(scaled, i == n - 1)
            else:
                (scaler.scale(scaled) if scaler is not None else scaled).backward()
        loss_sum += ls.detach()
    return loss_sum


def onednn_linear_for(enabled: bool, device: torch.device, precision: str, compiled: bool) -> bool:
    """Whether a step's `forward_backward` runs with use_onednn_linear: train.onednn_linear, on a
    CPU, under fp32 (no autocast), and not compiled (torch.compile lowers the products itself)."""
    return enabled and device.type == "cpu" and precision == "fp32" and not compiled


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
