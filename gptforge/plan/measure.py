"""Measure one training step's tensor memory without allocating it: FakeTensorMode + MemTracker.

The model is built under `torch._subclasses.fake_tensor.FakeTensorMode`, so every tensor carries
shape, dtype and device but no storage; `torch.distributed._tools.mem_tracker.MemTracker` counts
the bytes each one would take (rounded up to the CUDA caching allocator's 512-byte blocks) and
classifies them as parameters, gradients, optimizer states, activations and temporaries. The step is
the planner's picture of a training step: optimizer states already initialised (steady state),
`gradient_accumulation_steps` micro-batches (at most two are run: a third sees the same memory as
the second) of forward under autocast, cross-entropy on the fp32-upcast logits, backward, then the
optimizer step.

Fake tensors live on the CPU here (no CUDA needed), so kernels are chosen as on a CPU: SDPA's CPU
flash kernel keeps the same tensors as CUDA's flash kernel (output and logsumexp). CUDA context,
allocator fragmentation and communication buffers are not tensors and are not measured.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from gptforge.config import ModelConfig, ParallelConfig, TrainConfig

SUPPORTED_OPTIMIZERS = ("adamw", "sgd")


@dataclass
class MeasuredMemory:
    """Tracked peak of live tensor bytes during one training step, and its parts at that moment."""

    peak_bytes: int
    parts: dict = field(default_factory=dict)
    """Bytes at the peak by MemTracker category: Parameter, Buffer, Gradient, Activation, Temp,
    Optstate, Other."""
    seconds: float = 0.0
    """Wall time of the fake step on this CPU."""
    micro_batches_run: int = 1

    def to_dict(self) -> dict:
        return asdict(self)


def _autocast_dtype(precision: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def measure_step(model_cfg: ModelConfig, train_cfg: TrainConfig, parallel_cfg: ParallelConfig | None = None) -> MeasuredMemory:
    """Run one training step under FakeTensorMode with MemTracker; return the tracked peak (bytes).

    Single-device layouts only (tp = pp = dp = 1): sharded layouts need a process group.
    Allocates no real tensor memory; takes seconds on a CPU for GPT-2 small.

    Raises:
        ValueError: a layout, optimizer (adamw8bit, adafactor) or precision (fp8) the fake step
            cannot run; the message says which.
    """
    import torch
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from gptforge.model.gpt import GPT
    from gptforge.plan.memory import planning_layout, planning_train

    # The same wrapping the trainer applies, so "selective" means the same blocks in both.
    from gptforge.runtime.activation import apply_activation_checkpointing

    parallel_cfg = planning_layout(parallel_cfg or ParallelConfig())
    train_cfg = planning_train(train_cfg)
    if parallel_cfg.world_size != 1:
        raise ValueError("--measure runs a single-device step; set parallel.* to 1 (the formula still covers "
                         "sharded layouts)")
    if train_cfg.optimizer not in SUPPORTED_OPTIMIZERS:
        raise ValueError(f"--measure supports train.optimizer {', '.join(SUPPORTED_OPTIMIZERS)}; "
                         f"{train_cfg.optimizer} needs data-dependent steps fake tensors cannot run")
    if train_cfg.precision == "fp8":
        raise ValueError("--measure cannot run fp8 (it needs torchao float8 kernels); measure bf16 instead")
    cfg = model_cfg.resolved()
    dtype = _autocast_dtype(train_cfg.precision)
    ga = min(train_cfg.gradient_accumulation_steps, 2)
    start = time.perf_counter()
    with FakeTensorMode():
        model = GPT(cfg)
        model.train()
        apply_activation_checkpointing(model, train_cfg.activation_checkpointing, preserve_rng_state=False)
        params = list(model.parameters())
        if train_cfg.optimizer == "adamw":
            opt: torch.optim.Optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)
        else:
            opt = torch.optim.SGD(params, lr=1e-4, momentum=0.9)
        # Steady state: optimizer states exist before the step, as from the second step on.
        for p in params:
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
        shape = (train_cfg.micro_batch_size, cfg.block_size)
        batches = [(torch.randint(0, cfg.vocab_size, shape), torch.randint(0, cfg.vocab_size, shape))
                   for _ in range(ga)]
        tracker = MemTracker()
        tracker.track_external(model, opt, *[t for pair in batches for t in pair])

        def micro_step(idx, tgt):
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                logits = model(idx)
                loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), tgt.view(-1))
            loss.backward()

        with tracker:
            for idx, tgt in batches:
                tracker.reset_mod_stats()
                micro_step(idx, tgt)
            opt.step()
            opt.zero_grad(set_to_none=True)
        snap = tracker.get_tracker_snapshot("peak")
    seconds = time.perf_counter() - start
    dev = next(iter(snap))
    parts = {str(getattr(k, "value", k)): int(v) for k, v in snap[dev].items()}
    peak = parts.pop("Total")
    return MeasuredMemory(peak_bytes=peak, parts=parts, seconds=seconds, micro_batches_run=ga)
