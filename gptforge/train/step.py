"""One optimizer step's forward and backward, for a plain module and through a pipeline schedule.

Per optimizer step: `gradient_accumulation_steps` micro-batches under autocast; each micro-batch's
summed loss (the run's objective, gptforge.train.objectives; next-token by default) is divided by
the count of the objective's units (target tokens, sequences, pairs) of the whole optimizer step,
so the update equals one big batch's mean-per-unit loss, not a mean of micro-batch means.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from gptforge.data.loader import TokenStream
from gptforge.runtime.device import autocast_context
from gptforge.runtime.loss import IGNORE_INDEX, token_loss_sum
from gptforge.runtime.onednn_linear import onednn_linear
from gptforge.train.objectives import Forward, NextToken, Objective, to_device
from gptforge.train.parallel.parallelize import Parallelized


@dataclass
class StepSums:
    """This rank's sums over one optimizer step's micro-batches (detached).

    loss: the objective's summed loss (0-dim). metrics: name -> [sum, weight] of the objective's
    metrics (`gptforge.train.objectives.ObjectiveLoss.metrics`), summed over the micro-batches.
    """

    loss: torch.Tensor
    metrics: dict[str, list[torch.Tensor | float]] = field(default_factory=dict)


def forward_backward(model: torch.nn.Module, micro_batches: list, loss_divisor: float, device: torch.device,
                     precision: str = "fp32", scaler: torch.amp.GradScaler | None = None,
                     grad_sync: Callable[[bool], Any] | None = None,
                     backward: Callable[[torch.Tensor, bool], None] | None = None,
                     objective: Objective | None = None, use_onednn_linear: bool = False) -> torch.Tensor:
    """Accumulate gradients of sum(objective losses) / loss_divisor over the micro-batches.

    With loss_divisor = the step's total count of the objective's units (target tokens for the
    default `NextToken`), the accumulated gradient equals that of the mean loss per unit of one
    batch holding all micro-batches, however the units are spread across micro-batches (a mean
    of micro-batch means would weight them unequally). For `NextToken` each micro-batch is
    (inputs (b, T), targets (b, T)) int64, or a dict (see `unpack_micro_batch`); targets -100
    are ignored. Other objectives read their own micro-batches (gptforge.train.objectives).

    Data parallel: pass loss_divisor = (global count over all dp ranks) / dp, because DDP
    and FSDP2 average gradients over the dp ranks; `grad_sync(is_last)` gives the context of each
    backward (gradients are reduced across ranks on the last micro-batch only).
    `backward(loss, is_last)` replaces `loss.backward()` (a backend's, e.g. DeepSpeed's engine).
    `use_onednn_linear`: forward and backward inside `gptforge.runtime.onednn_linear.onednn_linear`
    (only fp32 CPU linear layers change; pass it for eager steps only, see `onednn_linear_for`).

    Returns: this rank's summed loss (nats for NextToken; 0-dim, detached), for logging.
    """
    return forward_backward_sums(model, micro_batches, loss_divisor, device, precision, scaler, grad_sync, backward,
                                 objective, use_onednn_linear).loss


def forward_backward_sums(model: torch.nn.Module, micro_batches: list, loss_divisor: float, device: torch.device,
                          precision: str = "fp32", scaler: torch.amp.GradScaler | None = None,
                          grad_sync: Callable[[bool], Any] | None = None,
                          backward: Callable[[torch.Tensor, bool], None] | None = None,
                          objective: Objective | None = None, use_onednn_linear: bool = False) -> StepSums:
    """`forward_backward` that also returns the objective's metric sums (StepSums)."""
    objective = objective if objective is not None else NextToken()
    forward = Forward(model, device, precision)
    out = StepSums(torch.zeros((), device=device))
    n = len(micro_batches)
    for i, mb in enumerate(micro_batches):
        mb = to_device(mb, device)
        with (grad_sync(i == n - 1) if grad_sync is not None else contextlib.nullcontext(),
              onednn_linear(use_onednn_linear)):
            result = objective.loss(forward, mb)
            ls = result.loss
            scaled = ls / max(loss_divisor, 1e-12) if loss_divisor > 0 else ls
            if backward is not None:
                backward(scaled, i == n - 1)
            else:
                (scaler.scale(scaled) if scaler is not None else scaled).backward()
        out.loss += ls.detach()
        for name, (value, weight) in result.metrics.items():
            acc = out.metrics.setdefault(name, [0.0, 0.0])
            acc[0] = acc[0] + (value.detach() if isinstance(value, torch.Tensor) else value)
            acc[1] = acc[1] + weight
    return out


def onednn_linear_for(enabled: bool, device: torch.device, precision: str, compiled: bool) -> bool:
    """Whether a step's `forward_backward` runs with use_onednn_linear: train.onednn_linear, on a
    CPU, under fp32 (no autocast), and not compiled (torch.compile lowers the products itself)."""
    return enabled and device.type == "cpu" and precision == "fp32" and not compiled


class PipelineLoss:
    """loss_fn of the last pipeline stage: a micro-batch's summed loss / `divisor`.

    Training uses the objective's `pipeline_loss` (gptforge.train.objectives; the default is the
    summed next-token loss); evaluation (`training` False) the summed next-token loss, as every
    validation figure is. The divisor is the step's global count (over dp ranks, / dp), so the
    schedule runs with scale_grads=False: dividing again by the micro-batch count would be wrong
    whenever micro-batches hold different numbers of units. The raw sums are kept in `sums`.
    """

    def __init__(self, objective: Objective | None = None):
        self.objective = objective if objective is not None else NextToken()
        self.divisor = 1.0
        self.training = True
        self.sums: list[torch.Tensor] = []

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        ls = self.objective.pipeline_loss(logits, targets) if self.training else token_loss_sum(logits, targets)
        self.sums.append(ls.detach())
        return ls / self.divisor


def _pipeline_run(par: Parallelized, pp_loss: PipelineLoss, x: torch.Tensor, y: torch.Tensor,
                  device: torch.device, precision: str, train: bool) -> torch.Tensor:
    has_first = any(s.is_first for s in par.stages)
    has_last = any(s.is_last for s in par.stages)
    pp_loss.sums = []
    pp_loss.training = train
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
