"""Model FLOPs utilisation: achieved training FLOP/s over the device's dense peak.

MFU = tokens_per_second * flops_per_token / peak (PaLM, Chowdhery et al. 2022, appendix B), with
flops_per_token = 6N + 12*L*H*Q*T from `gptforge.plan.flops.flops_per_token`.
The peak is the datasheet's dense (not 2:4 sparse) figure for known GPUs; on a CPU there is no
datasheet, so the matmul peak is measured once at start (`gptforge.runtime.device.cpu_matmul_peak`, the
same figure `train.precision auto` printed) and the figure is labelled as such.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gptforge.runtime.device import cpu_matmul_peak


@dataclass
class Peak:
    """A device's peak in FLOP/s for one precision, and where the figure comes from."""

    flops_per_second: float | None
    label: str


def device_peak(device: torch.device, precision: str) -> Peak:
    """Dense peak FLOP/s of `device` for `precision` (fp32, bf16, fp16).

    CUDA: the GPU table in `gptforge.plan.hardware` matched on the device name (fp32 training
    uses the TF32 tensor-core figure when TF32 matmuls are enabled, else the non-tensor FP32 one).
    CPU: measured matmul peak (`cpu_matmul_peak`: one measurement per process). Unknown GPU or MPS: None, labelled.
    """
    if device.type == "cpu":
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
        return Peak(cpu_matmul_peak(dtype), f"measured CPU {dtype_name(dtype)} matmul peak")
    if device.type == "cuda":
        from gptforge.plan.hardware import gpu_for_device_name

        name = torch.cuda.get_device_name(device)
        gpu = gpu_for_device_name(name)
        if gpu is None:
            return Peak(None, f"{name} is not in the GPU table (gptforge plan --list-gpus); MFU not computed")
        prec = precision
        if precision == "fp32" and not torch.backends.cuda.matmul.allow_tf32:
            return Peak(gpu.fp32_tflops * 1e12, f"{gpu.full_name} dense fp32 (TF32 off) peak, {gpu.source}")
        return Peak(gpu.peak_flops(prec), f"{gpu.full_name} dense {prec} peak, {gpu.source}")
    return Peak(None, f"no peak figure for device type {device.type}")


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
