"""The planner's Python API: `plan(...)` for the whole picture, `predict_peak_memory_bytes` for the trainer."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from gptforge.config import ModelConfig, ParallelConfig, TrainConfig, to_dict
from gptforge.plan.flops import chinchilla_tokens
from gptforge.plan.hardware import GPU, get_gpu
from gptforge.plan.memory import MemoryEstimate, estimate_memory, planning_layout, planning_train
from gptforge.plan.params import param_count
from gptforge.plan.timing import SpeedEstimate, estimate_speed


@dataclass
class Plan:
    """Everything the planner predicts for one job. Bytes, FLOPs, tokens, seconds."""

    fits: bool | None
    """Whether the per-GPU total fits the GPU's memory (None without a GPU)."""
    param_count: int
    model: dict
    train: dict
    parallel: dict
    num_gpus: int
    gpu: dict | None
    memory: MemoryEstimate
    speed: SpeedEstimate | None
    tokens: float
    tokens_source: str
    """'given' or 'chinchilla (20 tokens/parameter)'."""
    notes: list = field(default_factory=list)
    fixes: list = field(default_factory=list)
    """When it does not fit: [(command-line change, predicted peak tensor bytes)], cheapest first."""

    def to_dict(self) -> dict:
        """Flat-ish dict for --json: top-level `fits`, `param_count`, and every figure by name."""
        d = asdict(self)
        d["memory"] = self.memory.to_dict()
        d["speed"] = self.speed.to_dict() if self.speed else None
        # Headline figures at the top level as well, for machines that want one key.
        d["memory_total_bytes"] = self.memory.total
        d["peak_tensor_bytes"] = self.memory.peak_tensor_bytes
        if self.gpu:
            d["headroom_bytes"] = self.memory.capacity - self.memory.total
        return d


def resolve_layout(parallel: ParallelConfig, num_gpus: int | None) -> tuple[ParallelConfig, int]:
    """Reconcile `--num-gpus` with the parallel section.

    With only num_gpus, the GPUs not used by tp*pp become data parallel: dp_shard under ZeRO-3,
    else dp_replicate. With only a parallel section, num_gpus = its world size.

    Raises:
        ValueError: num_gpus not divisible by tp*pp, or disagreeing with an explicit layout.
    """
    if num_gpus is None or parallel.dp_shard != -1:
        parallel = planning_layout(parallel)
    else:  # dp_shard -1 (the default) is "not set": the GPUs left become data parallel below
        parallel = planning_layout(replace(parallel, dp_shard=1))
    world = parallel.world_size
    if num_gpus is None:
        return parallel, world
    if num_gpus < 1:
        raise ValueError(f"--num-gpus must be >= 1, got {num_gpus}")
    if world == num_gpus:
        return parallel, num_gpus
    if parallel.dp_replicate == 1 and parallel.dp_shard == 1:
        mp = parallel.tp * parallel.pp
        if num_gpus % mp:
            raise ValueError(f"--num-gpus {num_gpus} is not divisible by parallel.tp * parallel.pp = {mp}")
        dp = num_gpus // mp
        if parallel.zero_stage == 3:
            return replace(parallel, dp_shard=dp), num_gpus
        return replace(parallel, dp_replicate=dp), num_gpus
    raise ValueError(
        f"--num-gpus {num_gpus} disagrees with the parallel section (dp_replicate*dp_shard*tp*pp = {world}); "
        "drop one of them"
    )


def plan(model_cfg: ModelConfig, train_cfg: TrainConfig | None = None, parallel_cfg: ParallelConfig | None = None,
         gpu: str | GPU | None = None, num_gpus: int | None = None, tokens: float | None = None,
         price: float | None = None, mfu: tuple[float, float] | None = None, finetune=None) -> Plan:
    """Predict per-GPU memory, speed, time and cost of a training job.

    model_cfg/train_cfg/parallel_cfg: the same dataclasses `pretrain` reads. gpu: short name
    (see `gptforge plan --list-gpus`) or a GPU; without one, memory is predicted but fit and
    speed are not. tokens: training tokens (default 20 per parameter, Chinchilla). price: per
    GPU-hour, any currency. mfu: (low, high) to override the assumed MFU range.

    Raises:
        ValueError: unknown preset/GPU, a layout that does not divide, bf16 on a GPU without it.
    """
    cfg = model_cfg.resolved()
    train_cfg = train_cfg or TrainConfig()
    parallel_cfg, n_gpus = resolve_layout(parallel_cfg or ParallelConfig(), num_gpus)
    g = get_gpu(gpu) if isinstance(gpu, str) else gpu
    train_cfg = planning_train(train_cfg, g)
    n = param_count(cfg)
    notes = []
    peak = None
    if g is not None:
        peak = g.peak_flops(train_cfg.precision)  # raises for bf16 on V100/T4
        if train_cfg.precision == "fp32" and g.tf32_tflops:
            notes.append("fp32 speed assumes TF32 matmuls (torch.backends.cuda.matmul.allow_tf32 = True)")
    capacity = g.memory_bytes if g else 0
    if finetune is not None and (finetune.method != "full" or finetune.objective != "sft"):
        from gptforge.plan.finetune_memory import estimate_finetune_memory

        mem = estimate_finetune_memory(cfg, train_cfg, finetune, parallel_cfg, capacity_bytes=capacity)
    else:
        mem = estimate_memory(cfg, train_cfg, parallel_cfg, capacity_bytes=capacity)
    if finetune is not None and finetune.method != "full":
        from gptforge.plan.finetune_memory import finetune_states

        st = finetune_states(cfg, finetune)
        notes.append(f"fine-tuning ({finetune.method}, rank {finetune.lora_rank}): {st['adapter_params']:,} adapter "
                     f"parameters trained, the {st['base_params']:,} base parameters frozen"
                     + (" and their block linears stored in 4 bits" if finetune.method == "qlora" else ""))
    if tokens is None:
        tokens_v, source = float(chinchilla_tokens(n)), "chinchilla (20 tokens/parameter)"
    else:
        if tokens <= 0:
            raise ValueError(f"--tokens must be > 0, got {tokens}")
        tokens_v, source = float(tokens), "given"
    speed = None
    if g is not None:
        speed = estimate_speed(cfg, train_cfg, parallel_cfg, n, peak, n_gpus, tokens_v, price, mfu=mfu)
    if parallel_cfg.effective_zero_stage() != parallel_cfg.zero_stage:
        notes.append("parallel.dp_shard > 1 with zero_stage 0 is FSDP2 full sharding: planned as ZeRO-3")
    fixes = []
    if g is not None and mem.fits is False and (finetune is None or finetune.method == "full"):
        from gptforge.plan.advice import fit_changes

        headroom = mem.total - mem.peak_tensor_bytes  # buffers, context and margin come on top
        fixes = fit_changes(cfg, train_cfg, parallel_cfg, capacity - headroom)
    return Plan(
        fixes=fixes, fits=mem.fits, param_count=n, model=to_dict(cfg), train=to_dict(train_cfg), parallel=to_dict(parallel_cfg),
        num_gpus=n_gpus, gpu=g.to_dict() if g else None, memory=mem, speed=speed, tokens=tokens_v,
        tokens_source=source, notes=notes,
    )


def predict_peak_memory_bytes(model_cfg: ModelConfig, train_cfg: TrainConfig, parallel_cfg: ParallelConfig | None = None,
                              device_kind: str = "cuda") -> int:
    """Predicted peak of allocated tensor bytes on one device for a training step.

    Comparable with `torch.cuda.max_memory_allocated()` after the first optimizer step: tensor
    bytes (model states, activations, logits/loss buffers, autocast copies) plus, on CUDA, the
    communication buffers, which are tensors too. CUDA context and allocator margin are excluded
    (they are not allocations). device_kind: 'cuda', 'cpu' or 'mps'.

    Raises:
        ValueError: bad config (see `estimate_memory`) or unknown device_kind.
    """
    if device_kind not in ("cuda", "cpu", "mps"):
        raise ValueError(f"device_kind must be cuda, cpu or mps, got {device_kind!r}")
    est = estimate_memory(model_cfg.resolved(), train_cfg, parallel_cfg or ParallelConfig())
    return est.peak_tensor_bytes + (est.comm_buckets if device_kind == "cuda" else 0)
