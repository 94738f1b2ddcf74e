"""Time budgets: a measured step time, and the number of steps that fit in a number of minutes."""

from __future__ import annotations

import time

import numpy as np
import torch

from gptforge.config import ModelConfig, TrainConfig
from gptforge.runtime.host_memory import keep_freed_memory


def measure_step_seconds(model_cfg: ModelConfig, train_cfg: TrainConfig, repeats: int = 3,
                         whole: bool = True) -> float:
    """Seconds per optimizer step of this shape on this machine (median of `repeats` after a warm-up),
    measured on random tokens with the same model, optimizer, batch and precision as the run, and
    compiled as the run compiles (`gptforge.train.parallel.parallelize.apply_compile`: the whole model
    when `whole`, per block otherwise) when `train_cfg.compile is True` (the warm-up step then
    includes the compilation). On a CPU it first sets glibc's allocator policy as the CPU run does
    (`gptforge.runtime.host_memory.keep_freed_memory`, process-wide): without it every step
    page-faults its buffers again and the figure overestimates the run's step. train_cfg: pre-resolved (train.lr set:
    gptforge.train.resolve.pre_resolve); ValueError otherwise (gptforge.train.optim.require_resolved)."""
    from gptforge.model.gpt import GPT
    from gptforge.runtime.device import pick_device, resolve_precision
    from gptforge.train.optim import build_optimizer
    from gptforge.train.step import forward_backward, onednn_linear_for

    device = pick_device(train_cfg.device)
    precision = resolve_precision(train_cfg.precision, device)
    keep_freed_memory(device_type=device.type)  # as gptforge.train.run.train does before the first step
    cfg = model_cfg.resolved()
    model = GPT(cfg).to(device)
    if train_cfg.compile is True:
        from gptforge.train.parallel.parallelize import apply_compile

        apply_compile(model, whole=whole)
    opt = build_optimizer(model, train_cfg, device.type)
    g = torch.Generator().manual_seed(0)
    shape = (train_cfg.micro_batch_size, cfg.block_size)
    micro = [(torch.randint(0, cfg.vocab_size, shape, generator=g), torch.randint(0, cfg.vocab_size, shape, generator=g))
             for _ in range(train_cfg.gradient_accumulation_steps)]
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        forward_backward(model, micro, micro[0][1].numel() * len(micro), device, precision,
                         use_onednn_linear=onednn_linear_for(train_cfg.onednn_linear, device, precision,
                                                             train_cfg.compile is True))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def steps_for_minutes(minutes: float, step_seconds: float, eval_share: float = 0.1, minimum: int = 20,
                      spent_seconds: float = 0.0) -> int:
    """Optimizer steps that fit in `minutes` at `step_seconds` per step once `spent_seconds` (the
    start-up probes: compile choice, step timing) are taken off, leaving `eval_share` of the rest to
    evaluation and checkpoints; at least `minimum`."""
    left = max(0.0, minutes * 60 - spent_seconds)
    return max(minimum, int(left * (1 - eval_share) / step_seconds))
