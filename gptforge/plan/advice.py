"""What to change when a training step does not fit in memory: the planner's cheapest fixes.

Each candidate keeps the global batch (and so the optimisation) the same, and is priced by the
planner's own estimate (gptforge.plan.memory.estimate_memory), so the advice and `gptforge plan`
agree. Ordered from the cheapest in speed: smaller micro-batches with more accumulation (fewer
tokens per kernel), then selective and full activation checkpointing (about 1/3 and 1 extra
forward pass, Korthikanti et al. 2022, section 5), then ZeRO-3 sharding of model states over the
data-parallel ranks (more communication).
"""

from __future__ import annotations

import dataclasses

from gptforge.config import ModelConfig, ParallelConfig, TrainConfig
from gptforge.plan.memory import estimate_memory, planning_layout


def fit_changes(model: ModelConfig, train: TrainConfig, parallel: ParallelConfig,
                capacity_bytes: int) -> list[tuple[str, int]]:
    """Changes that bring the predicted per-device peak of tensors under `capacity_bytes`.

    Returns: [(the change as command-line options, its predicted peak tensor bytes)], cheapest
    first; empty when nothing tried fits.
    """
    parallel = planning_layout(parallel)
    options: list[tuple[str, TrainConfig, ParallelConfig]] = []
    mb, ga = train.micro_batch_size, train.gradient_accumulation_steps
    while mb > 1 and mb % 2 == 0:
        mb, ga = mb // 2, ga * 2
        options.append((f"--train.micro_batch_size {mb} --train.gradient_accumulation_steps {ga}",
                        dataclasses.replace(train, micro_batch_size=mb, gradient_accumulation_steps=ga), parallel))
    for ac in ("selective", "full"):
        if train.activation_checkpointing != ac:
            options.append((f"--train.activation_checkpointing {ac}",
                            dataclasses.replace(train, activation_checkpointing=ac), parallel))
    if parallel.dp > 1 and parallel.effective_zero_stage() != 3:
        z3 = dataclasses.replace(parallel, dp_replicate=1, dp_shard=parallel.dp, zero_stage=3)
        options.append((f"--parallel.dp_shard {parallel.dp} --parallel.dp_replicate 1 --parallel.zero_stage 3",
                        train, z3))
    out = []
    for text, tc, pc in options:
        try:
            est = estimate_memory(model.resolved(), tc, pc)
        except ValueError:
            continue
        if est.peak_tensor_bytes <= capacity_bytes:
            out.append((text, est.peak_tensor_bytes))
    return out


def out_of_memory_message(model: ModelConfig, train: TrainConfig, parallel: ParallelConfig,
                          capacity_bytes: int | None, measured_bytes: int | None) -> str:
    """The advice printed when a step runs out of memory: predicted and measured peaks and the
    cheapest changes that would fit (`fit_changes`)."""
    gib = 2**30
    try:
        predicted = estimate_memory(model.resolved(), train, planning_layout(parallel)).peak_tensor_bytes
        lines = [f"out of memory: the planner predicted a peak of {predicted / gib:.2f} GiB of tensors per device"]
    except ValueError:
        lines = ["out of memory (no planner prediction for this layout)"]
    if measured_bytes:
        lines[0] += f"; measured peak {measured_bytes / gib:.2f} GiB"
    if capacity_bytes:
        lines[0] += f"; the device holds {capacity_bytes / gib:.2f} GiB"
        fixes = fit_changes(model, train, parallel, capacity_bytes)
        if fixes:
            lines.append("changes predicted to fit, cheapest first:")
            lines += [f"  {text}   (predicted {b / gib:.2f} GiB)" for text, b in fixes[:4]]
        else:
            lines.append("no single change fits: use a smaller model.block_size or model, or more devices")
    return "\n".join(lines)
