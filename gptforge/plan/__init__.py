"""Planner: per-GPU memory, FLOPs, speed and cost of a training job, before a GPU is booked.

    from gptforge.plan import plan, predict_peak_memory_bytes
    p = plan(ModelConfig(preset="llama-3-8b"), TrainConfig(micro_batch_size=1, precision="bf16"),
             ParallelConfig(zero_stage=3), gpu="h100-sxm", num_gpus=8, price=2.5)
    p.fits, p.memory.total, p.speed.tokens_per_second_low

Modules: hardware (GPU table), params (shapes), memory (closed-form memory), flops (FLOPs, MFU),
timing (speed, time, cost), search (`--recommend`), measure (fake-tensor check of the formula).
"""

from gptforge.plan.planner import Plan, plan, predict_peak_memory_bytes, resolve_layout

__all__ = ["Plan", "plan", "predict_peak_memory_bytes", "resolve_layout"]
