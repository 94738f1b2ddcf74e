"""Per-device memory of LoRA and QLoRA fine-tuning: frozen base, adapters, 4-bit weights.

What differs from full training (`gptforge.plan.memory.estimate_memory`) is the model states:

- LoRA (Hu et al. 2021): the base weights stay (fp32 as gptforge loads them) but get no
  gradient and no optimizer state; each targeted linear (out, in) gains A (r, in) and B (out, r),
  which are trained: fp32 weight + fp32 gradient + AdamW's two fp32 moments = 16 bytes each.
- QLoRA (Dettmers et al. 2023, section 3): the blocks' linear weights are stored in 4 bits, two
  per byte, with one fp32 absmax per block of 64 weights; with double quantization the absmax
  values become 8-bit codes with one fp32 scale per 256 of them (0.127 instead of 0.5 bits per
  weight, the paper's figure). Embeddings, norms and the head stay fp32. Adapters as in LoRA.

Activations are those of full training (the backward pass still runs through every frozen layer
to reach the adapters; its weight gradients are not kept), so the estimate takes them, the logits
and the temporaries from `estimate_memory` and swaps the model states.
"""

from __future__ import annotations

import math

from gptforge.config import FinetuneConfig, ModelConfig, ParallelConfig, TrainConfig
from gptforge.plan.memory import MemoryEstimate, estimate_memory

QLORA_BLOCK = 64
"""Weights per absmax scale (bitsandbytes' and the QLoRA paper's default)."""
NESTED_BLOCK = 256
"""Absmax values per second-level scale under double quantization."""


def block_linear_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(out, in) of each linear of one block, by the module names LoRA targets."""
    hd = cfg.head_dim
    shapes = {"q_proj": (cfg.n_head * hd, cfg.d_model), "k_proj": (cfg.n_kv_head * hd, cfg.d_model),
              "v_proj": (cfg.n_kv_head * hd, cfg.d_model), "o_proj": (cfg.d_model, cfg.n_head * hd),
              "up_proj": (cfg.d_ff, cfg.d_model), "down_proj": (cfg.d_model, cfg.d_ff)}
    if cfg.arch == "llama":
        shapes["gate_proj"] = (cfg.d_ff, cfg.d_model)
    return shapes


def finetune_states(model: ModelConfig, fc: FinetuneConfig) -> dict[str, int]:
    """Bytes of the model states of a LoRA / QLoRA fine-tune on one device.

    Returns {"weights", "gradients", "optimizer_states", "adapter_params", "base_params"}.

    Raises:
        InputError: a target module the architecture does not have, or method full (use
            estimate_memory).
    """
    from gptforge.errors import InputError
    from gptforge.plan.params import param_count

    if fc.method == "full":
        raise InputError("finetune.method full trains every weight: use estimate_memory")
    cfg = model.resolved()
    shapes = block_linear_shapes(cfg)
    targets = list(shapes) if list(fc.lora_target_modules) == ["all"] else list(fc.lora_target_modules)
    unknown = [t for t in targets if t not in shapes]
    if unknown:
        raise InputError(f"finetune.lora_target_modules: {unknown} not in a {cfg.arch} block ({', '.join(shapes)})")
    r = fc.lora_rank
    adapter = cfg.n_layer * sum(r * (i + o) for name, (o, i) in shapes.items() if name in targets)
    base = param_count(cfg)
    linear = cfg.n_layer * sum(o * i for o, i in shapes.values())
    if fc.method == "qlora":
        n_blocks = math.ceil(linear / QLORA_BLOCK)
        absmax = n_blocks * (1 if fc.qlora_double_quant else 4)
        nested = 4 * math.ceil(n_blocks / NESTED_BLOCK) if fc.qlora_double_quant else 0
        weights = (base - linear) * 4 + (linear + 1) // 2 + absmax + nested
    else:
        weights = base * 4
    return {"weights": weights + adapter * 4, "gradients": adapter * 4, "optimizer_states": adapter * 8,
            "adapter_params": adapter, "base_params": base}


def estimate_finetune_memory(model: ModelConfig, train: TrainConfig, fc: FinetuneConfig,
                             parallel: ParallelConfig | None = None, capacity_bytes: int = 0) -> MemoryEstimate:
    """Per-device memory of a fine-tuning step (`fc.method` full, lora or qlora), in bytes.

    full is `estimate_memory` itself. For lora / qlora the model states are `finetune_states`
    (passed to estimate_memory, which also drops the frozen head's gradient); activations, logits
    and temporaries are full training's (see the module docstring).
    """
    if fc.method == "full":
        return estimate_memory(model.resolved(), train, parallel, capacity_bytes=capacity_bytes)
    return estimate_memory(model.resolved(), train, parallel, capacity_bytes=capacity_bytes,
                           states=finetune_states(model, fc))
