"""Training FLOPs per token and model FLOPs utilisation (MFU).

Convention (PaLM, Chowdhery et al. 2022, appendix B): a training step costs, per token,

    6 * N                     (forward 2N + backward 4N for the parameter matmuls)
  + 12 * L * H * Q * T        (attention scores and their weighted sum: QK^T and AV, forward and
                               backward, with L layers, H query heads, head dim Q, sequence T)

where N counts every parameter (tied embeddings once). The Llama 2 paper's GPU-hour figures count
6N only; both conventions are offered and every figure the planner prints names its convention.
Activation recomputation adds hardware FLOPs but not model FLOPs: MFU counts the model FLOPs above,
hardware FLOPs utilisation (HFU) adds the recomputed forward (Korthikanti et al. 2022, section 6).
"""

from __future__ import annotations

import re

from gptforge.config import ModelConfig

CONVENTIONS = ("6N+attention", "6N")


def attention_flops_per_token(cfg: ModelConfig, seq_len: int | None = None) -> float:
    """12 * L * H * Q * T FLOPs per token (PaLM appendix B). seq_len defaults to block_size."""
    T = seq_len or cfg.block_size
    return 12.0 * cfg.n_layer * cfg.n_head * cfg.head_dim * T


def flops_per_token(cfg: ModelConfig, n_params: int, seq_len: int | None = None,
                    convention: str = "6N+attention") -> float:
    """Model FLOPs per trained token: 6N (+ 12*L*H*Q*T with the attention term). Units: FLOPs/token.

    Raises:
        ValueError: unknown convention.
    """
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown FLOPs convention {convention!r}; choose one of {CONVENTIONS}")
    f = 6.0 * n_params
    if convention == "6N+attention":
        f += attention_flops_per_token(cfg, seq_len)
    return f


def recompute_flops_per_token(cfg: ModelConfig, n_params: int, activation_checkpointing: str,
                              seq_len: int | None = None) -> float:
    """Extra hardware FLOPs per token spent recomputing the forward in backward.

    full: one more forward of every block, 2*N_blocks + 4*L*H*Q*T (Korthikanti et al. 2022, sec. 6:
    full recompute costs 33% more than 6N). selective here means "every other block fully
    recomputed" (gptforge's definition, see TrainConfig.activation_checkpointing): half of that.
    """
    if activation_checkpointing == "none":
        return 0.0
    from gptforge.plan.params import block_param_count

    fwd = 2.0 * block_param_count(cfg) * cfg.n_layer + attention_flops_per_token(cfg, seq_len) / 3.0
    if activation_checkpointing == "full":
        return fwd
    if activation_checkpointing == "selective":
        return fwd * (cfg.n_layer // 2) / cfg.n_layer
    raise ValueError(f"train.activation_checkpointing: unknown value {activation_checkpointing!r}")


def mfu(tokens_per_second: float, flops_per_token_: float, peak_flops: float, num_devices: int = 1) -> float:
    """Model FLOPs utilisation = achieved model FLOP/s / (peak FLOP/s * devices) (PaLM appendix B).

    tokens_per_second: for the whole job (all devices). peak_flops: dense peak of one device, FLOP/s.
    """
    return tokens_per_second * flops_per_token_ / (peak_flops * num_devices)


def gpu_hours(tokens: float, flops_per_token_: float, peak_flops: float, mfu_: float) -> float:
    """GPU-hours to train on `tokens` tokens at a given MFU: tokens * F / (peak * MFU) / 3600."""
    return tokens * flops_per_token_ / (peak_flops * mfu_) / 3600.0


def chinchilla_tokens(n_params: int, tokens_per_param: float = 20.0) -> int:
    """Compute-optimal token budget D = 20 * N (Hoffmann et al. 2022, table 3: ~20 tokens/parameter)."""
    return int(round(tokens_per_param * n_params))


_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_tokens(text: str) -> float:
    """'2T' -> 2e12, '300B' -> 3e11, '1.5e12' -> 1.5e12, '1_000_000' -> 1e6.

    Raises:
        ValueError: not a positive number with an optional k/M/B/T suffix.
    """
    s = str(text).strip().replace("_", "").replace(",", "")
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[0-9]+)?)([kKmMbBgGtT]?)", s)
    if not m:
        raise ValueError(f"--tokens: cannot read {text!r}; write e.g. 2T, 300B, 1.5e12")
    value = float(m.group(1)) * _SUFFIX.get(m.group(2).lower(), 1.0)
    if value <= 0:
        raise ValueError("--tokens must be > 0")
    return value
