"""`--recommend`: enumerate layouts for a GPU count, keep those that fit, rank by predicted speed.

The global batch (sequences per optimizer step = micro_batch_size * gradient_accumulation_steps *
dp) is held fixed, so every candidate trains the same model on the same batches; what changes is
how the work is laid out: micro-batch size (and so accumulation), activation checkpointing, ZeRO
stage, tensor/pipeline/data parallel degrees, and CPU offload only when nothing else fits.
Ranking: predicted tokens/s at the middle of each layout's MFU range (see `timing.mfu_range`),
ties broken by memory headroom.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gptforge.config import ModelConfig, Offload, ParallelConfig, TrainConfig
from gptforge.errors import InputError
from gptforge.plan.flops import flops_per_token
from gptforge.plan.hardware import GPU
from gptforge.plan.memory import MemoryEstimate, estimate_memory, planning_train
from gptforge.plan.params import param_count
from gptforge.plan.timing import mfu_range


@dataclass
class Candidate:
    """One layout that fits, with its predicted speed and headroom."""

    train: TrainConfig
    parallel: ParallelConfig
    memory: MemoryEstimate
    tokens_per_second: float
    """Whole job, middle of the MFU range."""
    mfu: float
    headroom_bytes: int
    host_bytes_per_node: int = 0
    """Host (CPU) memory the offloaded model states take on one node: the per-GPU offloaded bytes
    times the GPUs of a node; 0 without offload."""

    def recipe_lines(self) -> list[str]:
        """Config lines to paste into a recipe (YAML), the fields that differ between layouts."""
        t, p = self.train, self.parallel
        return [
            "train:",
            f"  micro_batch_size: {t.micro_batch_size}",
            f"  gradient_accumulation_steps: {t.gradient_accumulation_steps}",
            f"  activation_checkpointing: {t.activation_checkpointing}",
            "parallel:",
            f"  dp_replicate: {p.dp_replicate}",
            f"  dp_shard: {p.dp_shard}",
            f"  tp: {p.tp}",
            f"  pp: {p.pp}",
            f"  zero_stage: {p.zero_stage}",
            f"  offload: {p.offload}",
        ]

    def to_dict(self) -> dict:
        from gptforge.config import to_dict

        return {
            "train": {k: to_dict(self.train)[k] for k in ("micro_batch_size", "gradient_accumulation_steps",
                                                          "activation_checkpointing")},
            "parallel": to_dict(self.parallel),
            "memory_total_bytes": self.memory.total,
            "peak_tensor_bytes": self.memory.peak_tensor_bytes,
            "headroom_bytes": self.headroom_bytes,
            "tokens_per_second": self.tokens_per_second,
            "mfu": self.mfu,
            "host_bytes_per_node": self.host_bytes_per_node,
            "recipe": "\n".join(self.recipe_lines()),
        }


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def recommend(model: ModelConfig, train: TrainConfig, gpu: GPU, num_gpus: int, top: int = 5,
              global_batch_sequences: int | None = None, host_memory_bytes: int | None = None,
              gpus_per_node: int = 8) -> list[Candidate]:
    """The fastest layouts of `num_gpus` x `gpu` that fit, best first (at most `top`).

    global_batch_sequences: sequences per optimizer step to keep; default the train config's
    micro_batch_size * gradient_accumulation_steps * num_gpus (data parallel over all GPUs).
    host_memory_bytes: CPU memory of one node; an offload layout is kept only when the offloaded
    states of the node's min(num_gpus, gpus_per_node) GPUs fit in it (None: not checked, each
    offload candidate says what it needs in `host_bytes_per_node`).
    Returns [] when nothing fits, even with full checkpointing, ZeRO-3 and offload.
    """
    train = planning_train(train, gpu)
    cfg = model.resolved()
    n = param_count(cfg)
    peak = gpu.peak_flops(train.precision)
    f = flops_per_token(cfg, n)
    gbs = global_batch_sequences or train.micro_batch_size * train.gradient_accumulation_steps * num_gpus
    found: list[Candidate] = []
    offload_tiers: tuple[tuple[Offload, ...], ...] = (("none",), ("optimizer", "optimizer+params"))
    for offloads in offload_tiers:
        for tp in [d for d in _divisors(num_gpus) if d <= 8 and cfg.n_head % d == 0 and cfg.d_ff % d == 0]:
            for pp in [d for d in _divisors(num_gpus // tp) if d <= cfg.n_layer and d <= 16]:
                dp = num_gpus // (tp * pp)
                if gbs % dp:
                    continue
                per_rank = gbs // dp
                # One data-parallel rank: ZeRO-3 shards nothing, but it is how states are offloaded.
                for stage in ((0, 1, 2, 3) if dp > 1 else (0, 3) if "none" not in offloads else (0,)):
                    if pp > 1 and stage >= 2:
                        continue  # ZeRO-2/3 shard gradients that pipeline accumulation keeps whole
                    for offload in offloads:
                        if offload == "optimizer+params" and stage != 3:
                            continue
                        for ac in ("none", "selective", "full"):
                            for mb in [m for m in (1, 2, 4, 8, 16, 32, 64) if per_rank % m == 0]:
                                ga = per_rank // mb
                                if pp > 1 and ga < pp:
                                    continue
                                t2 = replace(train, micro_batch_size=mb, gradient_accumulation_steps=ga,
                                             activation_checkpointing=ac)
                                par = ParallelConfig(
                                    dp_replicate=1 if stage == 3 else dp, dp_shard=dp if stage == 3 else 1,
                                    tp=tp, pp=pp, zero_stage=stage, offload=offload,
                                    pp_microbatches=ga if pp > 1 else 0,
                                )
                                try:
                                    par.validate()  # the trainer's own rules: recommend only what it runs
                                except InputError:
                                    continue
                                mem = estimate_memory(cfg, t2, par, capacity_bytes=gpu.memory_bytes)
                                host = mem.cpu_offload_bytes * min(num_gpus, gpus_per_node)
                                if not mem.fits or host_memory_bytes is not None and host > host_memory_bytes:
                                    continue
                                lo, hi, _ = mfu_range(cfg, t2, par, n)
                                m_mid = (lo + hi) / 2
                                tps = m_mid * peak * num_gpus / f
                                found.append(Candidate(t2, par, mem, tps, m_mid, gpu.memory_bytes - mem.total, host))
        if found:
            break
    found.sort(key=lambda c: (-round(c.tokens_per_second, 6), -c.headroom_bytes))
    return found[:top]
