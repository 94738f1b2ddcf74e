"""Device choice and autocast for a precision name (fp32, bf16, fp16)."""

from __future__ import annotations

import contextlib

import torch

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def pick_device(name: str) -> torch.device:
    """`auto` -> CUDA if available, then MPS, then CPU; otherwise torch.device(name).

    Raises:
        ValueError: an unavailable device was asked for.
    """
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"train.device={name!r} but CUDA is not available here; use auto or cpu")
    return dev


def autocast_context(device: torch.device, precision: str):
    """torch.autocast for bf16/fp16, a no-op for fp32.

    Raises:
        ValueError: fp8 (planner-only) or bf16 on a CUDA GPU without bf16 support.
    """
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision not in AUTOCAST_DTYPES:
        raise ValueError(f"train.precision={precision!r} is not trainable here; use fp32, bf16 or fp16")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError("train.precision=bf16 but this GPU has no bf16 support; use fp16")
    return torch.autocast(device_type=device.type, dtype=AUTOCAST_DTYPES[precision])
