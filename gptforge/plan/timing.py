"""Throughput, step time, total time and cost from FLOPs and an MFU range.

Speed cannot be derived from first principles as exactly as memory: it depends on kernels,
interconnect and overlap. The planner therefore states an MFU *range* (model FLOPs utilisation,
PaLM appendix B) that well-tuned PyTorch training reaches, and derives tokens/s, step time, total
time and cost from it:

    tokens/s (job) = MFU * peak FLOP/s per GPU * GPUs / FLOPs per token
    step time      = tokens per optimizer step / tokens/s
    GPU-hours      = tokens * FLOPs per token / (peak * MFU) / 3600
    cost           = GPU-hours * price per GPU-hour

Base ranges (stated assumptions): models of 1B parameters and more reach 35-50% MFU in bf16 on
datacenter GPUs (Llama 3 report, section 3.3.4: 38-43% on H100; PaLM: 46.2% on TPU v4; Llama 2's
GPU-hours imply 39% on A100); smaller models, whose matmuls are too small to fill the GPU, 20-40%.
Penalty factors (heuristics, listed with each plan): recomputation spends hardware FLOPs that MFU
does not count; the pipeline bubble (p - 1) / (m + p - 1) idles stages (Narayanan et al. 2021);
tensor parallelism adds activation all-reduces (Shoeybi et al. 2019); ZeRO-3 all-gathers and CPU
offload add traffic that overlap hides only partly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from gptforge.config import ModelConfig, ParallelConfig, TrainConfig
from gptforge.plan.flops import flops_per_token, recompute_flops_per_token
from gptforge.plan.memory import planning_layout, planning_train


@dataclass
class SpeedEstimate:
    """Speed and cost range for one job. Units: FLOPs, tokens, seconds, price units."""

    flops_per_token: float
    """Model FLOPs per token, 6N + 12*L*H*Q*T (PaLM appendix B)."""
    flops_per_token_6n: float
    """6N only (the Llama 2 paper's GPU-hour convention)."""
    hardware_flops_per_token: float
    """flops_per_token plus recomputation."""
    peak_flops_per_gpu: float
    mfu_low: float
    mfu_high: float
    tokens_per_second_low: float
    """Whole job, all GPUs."""
    tokens_per_second_high: float
    tokens_per_step: int
    """micro_batch_size * gradient_accumulation_steps * dp * block_size."""
    step_time_seconds_low: float
    """Fastest step time (at mfu_high)."""
    step_time_seconds_high: float
    tokens: float
    """Training tokens of the whole run."""
    total_time_seconds_low: float
    total_time_seconds_high: float
    gpu_hours_low: float
    gpu_hours_high: float
    cost_low: float | None = None
    cost_high: float | None = None
    convention: str = "6N+attention"
    assumptions: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def mfu_range(model: ModelConfig, train: TrainConfig, parallel: ParallelConfig, n_params: int) -> tuple[float, float, list[str]]:
    """(low, high) MFU expected for a layout, with the reasons (see module docstring).

    All factors are heuristics stated in the returned list; measured MFU from a real run should
    replace them when available.
    """
    parallel, train = planning_layout(parallel), planning_train(train)
    notes: list[str] = []
    low, high = (0.35, 0.50) if n_params >= 1e9 else (0.20, 0.40)
    notes.append(f"base MFU {low:.0%}-{high:.0%} for {'>=' if n_params >= 1e9 else '<'}1B parameters")
    factor = 1.0
    model_f = flops_per_token(model, n_params)
    extra = recompute_flops_per_token(model, n_params, train.activation_checkpointing)
    if extra:
        factor *= model_f / (model_f + extra)
        notes.append(f"{train.activation_checkpointing} recomputation: x{model_f / (model_f + extra):.2f}")
    p = parallel.pp
    if p > 1:
        m = parallel.pp_microbatches or max(train.gradient_accumulation_steps, p)
        bubble = (p - 1) / (m + p - 1)
        if parallel.pp_schedule == "interleaved_1f1b":
            bubble /= 2
        factor *= 1 - bubble
        notes.append(f"pipeline bubble {bubble:.0%} (p={p}, m={m})")
    t = parallel.tp
    if t > 1:
        tp_f = {2: 0.95, 4: 0.9, 8: 0.85}.get(t, 0.5)
        factor *= tp_f
        notes.append(f"tensor parallel {t}: x{tp_f}" + (" (beyond one 8-GPU node)" if t > 8 else ""))
    stage = parallel.effective_zero_stage()
    if stage == 3 and parallel.dp > 1:
        factor *= 0.95
        notes.append("ZeRO-3 parameter all-gathers: x0.95")
    if parallel.offload == "optimizer":
        factor *= 0.7
        notes.append("optimizer offload to CPU: x0.7")
    elif parallel.offload == "optimizer+params":
        factor *= 0.5
        notes.append("parameter and optimizer offload to CPU: x0.5")
    tokens_per_micro = train.micro_batch_size * model.block_size
    if tokens_per_micro < 4096:
        factor *= 0.8
        notes.append(f"{tokens_per_micro} tokens per micro-batch (< 4096): x0.8")
    return low * factor, high * factor, notes


def estimate_speed(model: ModelConfig, train: TrainConfig, parallel: ParallelConfig, n_params: int,
                   peak_flops: float, num_gpus: int, tokens: float, price_per_gpu_hour: float | None = None,
                   mfu: tuple[float, float] | None = None) -> SpeedEstimate:
    """Tokens/s, step time, total time, GPU-hours and cost for a job (see module docstring).

    peak_flops: dense peak of one GPU at the training precision, FLOP/s. mfu: override the
    (low, high) range, e.g. with a measured MFU.
    """
    parallel, train = planning_layout(parallel), planning_train(train)
    f = flops_per_token(model, n_params)
    f6 = flops_per_token(model, n_params, convention="6N")
    hw = f + recompute_flops_per_token(model, n_params, train.activation_checkpointing)
    if mfu is None:
        lo, hi, notes = mfu_range(model, train, parallel, n_params)
    else:
        lo, hi = mfu
        notes = [f"MFU given: {lo:.1%}-{hi:.1%}"]
    tps_lo = lo * peak_flops * num_gpus / f
    tps_hi = hi * peak_flops * num_gpus / f
    tokens_per_step = train.micro_batch_size * train.gradient_accumulation_steps * parallel.dp * model.block_size
    gh_lo = tokens * f / (peak_flops * hi) / 3600.0
    gh_hi = tokens * f / (peak_flops * lo) / 3600.0
    return SpeedEstimate(
        flops_per_token=f, flops_per_token_6n=f6, hardware_flops_per_token=hw, peak_flops_per_gpu=peak_flops,
        mfu_low=lo, mfu_high=hi, tokens_per_second_low=tps_lo, tokens_per_second_high=tps_hi,
        tokens_per_step=tokens_per_step,
        step_time_seconds_low=tokens_per_step / tps_hi, step_time_seconds_high=tokens_per_step / tps_lo,
        tokens=tokens, total_time_seconds_low=tokens / tps_hi, total_time_seconds_high=tokens / tps_lo,
        gpu_hours_low=gh_lo, gpu_hours_high=gh_hi,
        cost_low=None if price_per_gpu_hour is None else gh_lo * price_per_gpu_hour,
        cost_high=None if price_per_gpu_hour is None else gh_hi * price_per_gpu_hour,
        assumptions=notes,
    )
