"""Device choice, autocast for a precision name (fp32, bf16, fp16), and `auto` precision."""

from __future__ import annotations

import contextlib
import os
import time
from typing import cast

import torch

from gptforge.config import Precision

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def pick_device(name: str, option: str = "train.device") -> torch.device:
    """`auto` -> CUDA if available, then MPS, then CPU; otherwise torch.device(name).

    `option`: the setting the error names, as the caller's user sets it (a config field such as
    `train.device`, or a command-line option such as `--device`).

    Raises:
        ValueError: an unknown or unavailable device was asked for (naming `option`).
    """
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:  # torch's parser: "Expected one of cpu, cuda, ..." with a traceback
        shown = f"{option} {name!r}" if option.startswith("--") else f"{option}={name!r}"
        raise ValueError(f"{shown}: not a device; use auto, cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        asked = f"{option} {name}" if option.startswith("--") else f"{option}={name!r}"
        raise ValueError(f"{asked} but CUDA is not available here; use auto or cpu")
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


def measure_cpu_matmul_peak(dtype: torch.dtype = torch.float32, n: int = 1024, seconds: float = 0.4) -> float:
    """Measured dense matmul throughput of this CPU (all torch threads), FLOP/s.

    Times repeated (n, n) @ (n, n) products (2*n^3 FLOPs each) for about `seconds`, best of runs.
    """
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    a @ b  # warm up threads and kernels
    best, t_end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        a @ b
        dt = time.perf_counter() - t0
        best = max(best, 2 * n**3 / dt)
    return best


_CPU_PEAKS: dict[tuple[torch.dtype, int], float] = {}
"""cpu_matmul_peak's figures, keyed by (dtype, torch thread count)."""


def cpu_matmul_peak(dtype: torch.dtype = torch.float32) -> float:
    """`measure_cpu_matmul_peak(dtype)`, measured once per process for each (dtype, torch thread count).

    Every user of a CPU peak (precision auto, the bf16 warning, MFU) calls this, so the figures a
    run prints and the MFU it reports come from one measurement (two measurements on a busy
    machine can differ by a factor of 2). FLOP/s.
    """
    key = (dtype, torch.get_num_threads())
    if key not in _CPU_PEAKS:
        _CPU_PEAKS[key] = measure_cpu_matmul_peak(dtype)
    return _CPU_PEAKS[key]


AUTO_PRECISION_ENV = "GPTFORGE_AUTO_PRECISION"
"""Environment variable that pins what `train.precision auto` resolves to (fp32, bf16 or fp16),
skipping the measurement (the test suite sets fp32, so its figures do not depend on the CPU)."""

SLOW_BF16_FACTOR = 0.5
"""An explicit bf16 on a CPU whose bf16 matmuls run below this share of fp32's gets a warning."""


def resolve_precision(precision: Precision, device: torch.device, log=None) -> Precision:
    """The precision a run trains in: `auto` -> what is fast on `device`, else `precision` itself.

    auto: on CUDA bf16 where the GPU supports it, else fp32 (fp16 needs a loss scaler and is
    never picked for you); on a CPU bf16 when its measured bf16 matmul peak beats fp32's by 20%
    (CPUs with AVX-512 BF16 or AMX), else fp32; fp32 elsewhere. The caller freezes the result in
    config.yaml so that a resume is exact. An explicit bf16 on a CPU where bf16 matmuls are much
    slower than fp32 (below SLOW_BF16_FACTOR) logs a warning with both figures. CPU figures come
    from `cpu_matmul_peak` (measured once; MFU reuses them).
    """
    pinned = os.environ.get(AUTO_PRECISION_ENV)
    say = log or (lambda m: None)
    if precision == "auto":
        if pinned:
            return cast(Precision, pinned)  # the tests' pin (GPTFORGE_AUTO_PRECISION), taken as given
        if device.type == "cuda":
            return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
        if device.type != "cpu":
            return "fp32"
        fp32, bf16 = cpu_matmul_peak(torch.float32), cpu_matmul_peak(torch.bfloat16)
        chosen: Precision = "bf16" if bf16 > 1.2 * fp32 else "fp32"
        say(f"train.precision auto -> {chosen}: CPU matmul peak bf16 {bf16 / 1e9:,.1f} vs fp32 {fp32 / 1e9:,.1f} "
            "GFLOP/s")
        return chosen
    if precision == "bf16" and device.type == "cpu" and not pinned:
        fp32, bf16 = cpu_matmul_peak(torch.float32), cpu_matmul_peak(torch.bfloat16)
        if bf16 < SLOW_BF16_FACTOR * fp32:
            say(f"WARNING: train.precision bf16 on this CPU: bf16 matmuls run at {bf16 / 1e9:,.1f} GFLOP/s against "
                f"{fp32 / 1e9:,.1f} for fp32 (no fast bf16 here); training will be slower than fp32. Use "
                "--train.precision fp32 or auto.")
    return precision


def device_memory_bytes(device: torch.device) -> int | None:
    """Total memory of `device` in bytes: a CUDA device's, or this machine's RAM for the CPU
    (sysconf); None for another device type, or where it cannot be read."""
    try:
        if device.type == "cuda":
            return int(torch.cuda.get_device_properties(device).total_memory)
        if device.type == "cpu":
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError, RuntimeError):
        return None
    return None
