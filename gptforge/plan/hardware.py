"""GPU table: memory, dense peak TFLOP/s per precision, memory bandwidth, with the datasheet as source.

Every TFLOP/s figure is the *dense* tensor-core peak (not the 2:4 structured-sparsity figure that
datasheets print beside it, which is exactly twice the dense one). For GeForce cards (RTX 3090,
RTX 4090) the figure is the one with FP32 accumulate, which is what PyTorch's matmuls use. None
means the card has no such data type (bf16 and tf32 on V100 and T4; fp8 before Hopper/Ada).

Memory is the datasheet capacity in GiB (NVIDIA's "80GB" on A100/H100 is 80 GiB of HBM; what the
driver makes visible is slightly less, and ECC on GDDR cards such as the T4 reserves a little more:
the planner's CUDA-context and allocator-margin terms are where that is accounted for).
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass
from typing import Optional

GiB = 2**30


@dataclass(frozen=True)
class GPU:
    """One accelerator model. TFLOP/s are dense tensor-core peaks (10^12 FLOP/s); memory in GiB."""

    name: str
    """Short name used on the command line (`--gpu h100-sxm`)."""
    full_name: str
    """Marketing name and form factor."""
    memory_gib: float
    """Device memory capacity from the datasheet, GiB."""
    bf16_tflops: Optional[float]
    """Dense bf16 tensor peak, TFLOP/s; None when the card has no bf16."""
    fp16_tflops: float
    """Dense fp16 tensor peak (fp32 accumulate), TFLOP/s."""
    fp8_tflops: Optional[float]
    """Dense fp8 tensor peak, TFLOP/s; None before Ada/Hopper/CDNA3."""
    tf32_tflops: Optional[float]
    """Dense tf32 tensor peak, TFLOP/s (fp32 training with TF32 matmuls); None before Ampere."""
    fp32_tflops: float
    """Non-tensor fp32 peak, TFLOP/s (fp32 training with TF32 disabled, or pre-Ampere)."""
    bandwidth_gbs: float
    """Memory bandwidth, GB/s (10^9 bytes/s)."""
    source: str
    """Datasheet or whitepaper the figures come from."""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GiB)

    def peak_flops(self, precision: str) -> float:
        """Dense peak in FLOP/s for a training precision (fp32 uses tf32 where the card has it).

        Raises:
            ValueError: the card lacks the data type (bf16 on V100/T4, fp8 before Ada/Hopper),
                naming a precision that works instead.
        """
        if precision == "auto":  # what the trainer picks on this card
            precision = "bf16" if self.bf16_tflops is not None else "fp32"
        if precision == "bf16":
            if self.bf16_tflops is None:
                raise ValueError(
                    f"train.precision bf16: the {self.full_name} has no bfloat16 support; "
                    f"use --train.precision fp16 (with a gradient scaler) or fp32"
                )
            return self.bf16_tflops * 1e12
        if precision == "fp16":
            return self.fp16_tflops * 1e12
        if precision == "fp8":
            if self.fp8_tflops is None:
                raise ValueError(
                    f"train.precision fp8: the {self.full_name} has no fp8 tensor cores; use bf16 or fp16"
                )
            return self.fp8_tflops * 1e12
        if precision == "fp32":
            return (self.tf32_tflops or self.fp32_tflops) * 1e12
        raise ValueError(f"train.precision: unknown precision {precision!r}; choose fp32, bf16, fp16 or fp8")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["memory_bytes"] = self.memory_bytes
        return d


_NV = "https://www.nvidia.com/content/dam/en-zz/Solutions/"
_V100 = "NVIDIA V100 Tensor Core GPU datasheet (SXM2): https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
_A100 = f"NVIDIA A100 Tensor Core GPU datasheet (SXM): {_NV}Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet: https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"

GPUS: dict[str, GPU] = {
    g.name: g
    for g in [
        GPU("v100-16g", "NVIDIA V100 SXM2 16GB", 16, None, 125.0, None, None, 15.7, 900, _V100),
        GPU("v100-32g", "NVIDIA V100 SXM2 32GB", 32, None, 125.0, None, None, 15.7, 900, _V100),
        GPU("t4", "NVIDIA T4 16GB", 16, None, 65.0, None, None, 8.1, 320,
            f"NVIDIA T4 datasheet: {_NV}Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf"),
        GPU("a10", "NVIDIA A10 24GB", 24, 125.0, 125.0, None, 62.5, 31.2, 600,
            f"NVIDIA A10 datasheet: {_NV}Data-Center/a10/pdf/datasheet-new/nvidia-a10-datasheet.pdf"),
        GPU("a100-40g", "NVIDIA A100 SXM4 40GB", 40, 312.0, 312.0, None, 156.0, 19.5, 1555, _A100),
        GPU("a100-80g", "NVIDIA A100 SXM4 80GB", 80, 312.0, 312.0, None, 156.0, 19.5, 2039, _A100),
        GPU("l40s", "NVIDIA L40S 48GB", 48, 362.05, 362.05, 733.0, 183.0, 91.6, 864,
            "NVIDIA L40S datasheet: https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413"),
        GPU("h100-sxm", "NVIDIA H100 SXM5 80GB", 80, 989.4, 989.4, 1978.9, 494.7, 67.0, 3350, _H100),
        GPU("h100-pcie", "NVIDIA H100 PCIe 80GB", 80, 756.5, 756.5, 1513.0, 378.0, 51.0, 2000, _H100),
        GPU("h200", "NVIDIA H200 SXM 141GB", 141, 989.4, 989.4, 1978.9, 494.7, 67.0, 4800,
            "NVIDIA H200 Tensor Core GPU datasheet: https://nvdam.widen.net/s/nb5zzzsjdf/hpc-datasheet-sc23-h200-datasheet-3002446"),
        GPU("rtx3090", "NVIDIA GeForce RTX 3090 24GB", 24, 71.0, 71.0, None, 35.6, 35.6, 936,
            "NVIDIA Ampere GA102 GPU architecture whitepaper, appendix A table (FP32-accumulate tensor rates)"),
        GPU("rtx4090", "NVIDIA GeForce RTX 4090 24GB", 24, 165.2, 165.2, 330.3, 82.6, 82.6, 1008,
            "NVIDIA Ada Lovelace GPU architecture whitepaper, appendix A table (FP32-accumulate tensor rates)"),
        GPU("mi300x", "AMD Instinct MI300X 192GB", 192, 1307.4, 1307.4, 2614.9, 653.7, 163.4, 5300,
            "AMD Instinct MI300X data sheet: https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf"),
    ]
}


def get_gpu(name: str) -> GPU:
    """Look up a GPU by short name (case-insensitive).

    Raises:
        ValueError: unknown name, with the nearest valid one and the full list.
    """
    key = name.strip().lower().replace(" ", "-")
    if key in GPUS:
        return GPUS[key]
    # Common spellings: the family name (h100, a100, v100: the SXM / largest-memory part, as cloud
    # offers list them first), a unique prefix (l40 -> l40s), or the model number alone (4090 ->
    # rtx4090); an ambiguous name lists its matches.
    alias = {"h100": "h100-sxm", "a100": "a100-80g", "v100": "v100-32g"}.get(key)
    if alias:
        return GPUS[alias]
    matches = [k for k in GPUS if k.startswith(key) or k.removeprefix("rtx") == key or k.split("-")[0] == key]
    if len(matches) == 1:
        return GPUS[matches[0]]
    if len(matches) > 1:
        raise ValueError(f"--gpu {name!r} matches {', '.join(matches)}: name one of them")
    close = difflib.get_close_matches(key, list(GPUS), n=1, cutoff=0.4)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"--gpu: unknown GPU {name!r}{hint}; known: {', '.join(GPUS)} (gptforge plan --list-gpus)")


def gpu_for_device_name(device_name: str) -> Optional[GPU]:
    """Best guess from a `torch.cuda.get_device_name()` string, e.g. 'NVIDIA H100 80GB HBM3' -> h100-sxm.

    Returns None when no entry matches; callers then say the peak is unknown rather than guessing.
    """
    s = device_name.lower()
    rules = [
        ("h200", "h200"), ("h100 pcie", "h100-pcie"), ("h100", "h100-sxm"), ("mi300x", "mi300x"),
        ("l40s", "l40s"), ("a10g", "a10"), ("a10", "a10"), ("4090", "rtx4090"), ("3090", "rtx3090"),
        ("t4", "t4"),
    ]
    if "a100" in s:
        return GPUS["a100-80g" if "80" in s else "a100-40g"]
    if "v100" in s:
        return GPUS["v100-32g" if "32" in s else "v100-16g"]
    for needle, name in rules:
        if needle in s:
            return GPUS[name]
    return None
