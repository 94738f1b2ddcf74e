"""QLoRA: LoRA adapters on a frozen base whose block linears are stored in 4 bits
(Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs", sections 3-4).

Every linear layer of the transformer blocks (q/k/v/o, gate/up/down) keeps its weight W (out, in)
as 4-bit NormalFloat (NF4, section 3 "4-bit NormalFloat Quantization"): blocks of 64 weights share
one absmax scale, and with double quantization (section 3 "Double Quantization") those fp32 scales
are themselves stored as 8-bit codes in blocks of 256 with one fp32 scale each, about 0.37 bits
per weight saved. The forward pass dequantizes W to the compute dtype (bf16 or fp32) inside
bitsandbytes' `matmul_4bit` and adds the adapters in full precision:

    y = x dequant(W)^T + b + (alpha / r) * dropout(x) A^T B^T        (QLoRA eq. 5, with LoRA's scaling)

Only A (r, in) and B (out, r) are trained. Embeddings, norms and the output head stay in their
original precision (as the paper's and PEFT's setups do: the head is tied to the embedding in many
models, and its quantization error would fall straight on the logits).

Quantization and the 4-bit matmul are bitsandbytes' (`bitsandbytes.functional.quantize_4bit`,
`bitsandbytes.matmul_4bit`, the functions `bnb.nn.Linear4bit` runs on). The packed weight and its
quantization statistics are plain registered buffers here, not `bnb.nn.Params4bit`: their shapes
depend only on (out, in, blocksize, double_quant), so `torch.distributed.checkpoint` saves and
reloads them in place like any tensor, and resume needs neither the original weights nor
bitsandbytes' variable-length packed quant-state blob. What a checkpoint stores per 4-bit layer:

    weight_4bit          uint8 ((out*in + 1) // 2, 1)   two 4-bit codes per byte
    weight_absmax        (ceil(out*in / 64),)            fp32 scales, or uint8 codes with double_quant
    weight_code          (16,) fp32                      the NF4 (or FP4) code book
    with double_quant:   weight_offset () fp32, weight_nested_absmax (ceil(n_blocks / 256),) fp32,
                         weight_nested_code (256,) fp32
    bias                 the layer's bias, unchanged (fp32), when it has one

about 0.5-0.56 bytes per base weight instead of 4 (fp32): the frozen base is re-written with every
checkpoint, but in its 4-bit form.

Exporting (`dequantize_model` then `lora.merge_lora`) gives weights dequant(W) + (alpha/r) B A:
the model that was trained, not the original full-precision weights plus the adapters.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptforge.errors import GptforgeError
from gptforge.model.lora import LORA_TARGETS, LoRAConfig, LoRALinear

QUANT_TYPES = ("nf4", "fp4")
COMPUTE_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
NESTED_BLOCKSIZE = 256  # bitsandbytes' fixed block size for the double-quantized scales


class QLoRAUnavailable(GptforgeError, RuntimeError):
    """bitsandbytes is missing, or cannot run 4-bit quantization on the chosen device."""


@dataclass
class QuantConfig:
    """How the frozen base weights are stored (QLoRA section 3)."""

    quant_type: str = "nf4"
    """nf4 (4-bit NormalFloat, the paper's data type) or fp4."""
    double_quant: bool = True
    """Quantize the per-block fp32 scales again to 8 bits (blocks of 256)."""
    compute_dtype: str = "fp32"
    """dtype the 4-bit weights are dequantized to for the matmul: bf16 or fp32."""
    blocksize: int = 64
    """Weights per absmax scale (bitsandbytes accepts 32..4096, powers of two)."""

    def validate(self) -> None:
        """Raises ValueError naming the bad field."""
        if self.quant_type not in QUANT_TYPES:
            raise ValueError(f"finetune.qlora_quant_type={self.quant_type!r}: choose nf4 or fp4")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"finetune.qlora_compute_dtype={self.compute_dtype!r}: choose bf16 or fp32")
        if self.blocksize not in (32, 64, 128, 256, 512, 1024, 2048, 4096):
            raise ValueError(f"qlora blocksize {self.blocksize}: a power of two from 32 to 4096")


def import_bitsandbytes():
    """Import bitsandbytes quietly (its CPU backend logs a warning about an optional kernel
    package that only speeds up inference-time gemv, which QLoRA training does not use).

    Raises:
        QLoRAUnavailable: bitsandbytes is not installed; the message says how to install it.
    """
    quiet = logging.getLogger("bitsandbytes")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        import bitsandbytes
    except ImportError as e:
        raise QLoRAUnavailable(
            "finetune.method=qlora stores the base weights in 4 bits with the bitsandbytes package, which is not "
            f"installed ({e}): pip install 'gptforge[qlora]' (or pip install bitsandbytes), or use "
            "--finetune.method lora (same adapters on a full-precision base)"
        ) from e
    finally:
        quiet.setLevel(level)
    return bitsandbytes


def check_device(device: torch.device | str, qcfg: QuantConfig | None = None) -> None:
    """Check that bitsandbytes can quantize, 4-bit matmul and dequantize on `device`, by running
    it on a small tensor (what bitsandbytes supports depends on its build and the hardware: CUDA
    and CPU here; XPU/MPS/HPU builds vary).

    Raises:
        QLoRAUnavailable: bitsandbytes missing, or failing on this device; the message names the
            device, the bitsandbytes version and the alternatives.
    """
    bnb = import_bitsandbytes()
    qcfg = qcfg or QuantConfig()
    device = torch.device(device)
    try:
        w = torch.linspace(-1, 1, 64 * 4, device=device).view(4, 64)
        layer = Linear4bit.from_weight(w, None, qcfg, device)
        x = torch.ones(2, 64, device=device)
        y = layer(x)
        ref = F.linear(x.to(layer.compute_dtype), layer.dequantized_weight(layer.compute_dtype))
        if not torch.allclose(y.float(), ref.float(), atol=1e-2, rtol=1e-2):
            raise RuntimeError("4-bit matmul disagrees with the dequantized weight")
    except QLoRAUnavailable:
        raise
    except Exception as e:  # the backend raises NotImplementedError, RuntimeError, OSError ...
        raise QLoRAUnavailable(
            f"finetune.method=qlora: bitsandbytes {bnb.__version__} cannot run 4-bit ({qcfg.quant_type}) "
            f"quantization on device {device} ({type(e).__name__}: {e}). Use --train.device cpu or a CUDA GPU "
            "that bitsandbytes supports, or --finetune.method lora"
        ) from e


def _quant_shapes(numel: int, qcfg: QuantConfig) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Buffer name -> (shape, dtype) of one quantized weight with `numel` elements (as
    bitsandbytes' quantize_4bit lays them out)."""
    n_blocks = math.ceil(numel / qcfg.blocksize)
    shapes = {
        "weight_4bit": (((numel + 1) // 2, 1), torch.uint8),
        "weight_absmax": ((n_blocks,), torch.uint8 if qcfg.double_quant else torch.float32),
        "weight_code": ((16,), torch.float32),
    }
    if qcfg.double_quant:
        shapes["weight_offset"] = ((), torch.float32)
        shapes["weight_nested_absmax"] = ((math.ceil(n_blocks / NESTED_BLOCKSIZE),), torch.float32)
        shapes["weight_nested_code"] = ((256,), torch.float32)
    return shapes


class Linear4bit(nn.Module):
    """A frozen linear layer with its weight (out, in) stored 4-bit by bitsandbytes.

    forward: x (..., in) -> (..., out) in x's dtype; computed as bitsandbytes' matmul_4bit of
    x cast to the compute dtype with the weight dequantized to it, plus the bias.
    Buffers: see the module docstring. `bias` stays an (untrained) parameter of the same name as
    in nn.Linear, so state-dict names other than the weight's are unchanged.
    """

    weight_4bit: torch.Tensor

    def __init__(self, in_features: int, out_features: int, bias: bool, qcfg: QuantConfig,
                 device: torch.device | str | None = None, bias_dtype: torch.dtype = torch.float32):
        super().__init__()
        qcfg.validate()
        self.in_features, self.out_features = in_features, out_features
        self.quant_type, self.blocksize, self.double_quant = qcfg.quant_type, qcfg.blocksize, qcfg.double_quant
        self.compute_dtype = COMPUTE_DTYPES[qcfg.compute_dtype]
        for name, (shape, dtype) in _quant_shapes(in_features * out_features, qcfg).items():
            self.register_buffer(name, torch.empty(shape, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=bias_dtype, device=device), requires_grad=False) \
            if bias else None

    @property
    def quantized_numel(self) -> int:
        """Elements of the weight this layer stores in packed form (for parameter counts)."""
        return self.in_features * self.out_features

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None, qcfg: QuantConfig,
                    device: torch.device | str | None = None) -> "Linear4bit":
        """Quantize `weight` (out, in) on `device` (default: its own) with bitsandbytes."""
        import_bitsandbytes()
        import bitsandbytes.functional as BF

        device = torch.device(device) if device is not None else weight.device
        out_f, in_f = weight.shape
        layer = cls(in_f, out_f, bias is not None, qcfg, device="meta",
                    bias_dtype=bias.dtype if bias is not None else torch.float32)
        packed, st = BF.quantize_4bit(weight.detach().to(device=device, dtype=torch.float32),
                                      blocksize=qcfg.blocksize, compress_statistics=qcfg.double_quant,
                                      quant_type=qcfg.quant_type)
        values = {"weight_4bit": packed, "weight_absmax": st.absmax, "weight_code": st.code}
        if qcfg.double_quant:
            values.update(weight_offset=st.offset.reshape(()), weight_nested_absmax=st.state2.absmax,
                          weight_nested_code=st.state2.code)
        for name, (shape, dtype) in _quant_shapes(in_f * out_f, qcfg).items():
            v = values[name].to(device)
            if tuple(v.shape) != shape or v.dtype != dtype:  # bitsandbytes changed its layout
                raise RuntimeError(f"bitsandbytes returned {name} {tuple(v.shape)} {v.dtype}, expected {shape} {dtype}")
            layer._buffers[name] = v.contiguous()
        if bias is not None:
            layer.bias = nn.Parameter(bias.detach().to(device).clone(), requires_grad=False)
        return layer

    def quant_state(self, dtype: torch.dtype | None = None):
        """bitsandbytes QuantState over this layer's buffers; `dtype`: what dequantization yields
        (default the compute dtype)."""
        from bitsandbytes.functional import QuantState

        state2 = None
        if self.double_quant:
            state2 = QuantState(absmax=self.weight_nested_absmax, code=self.weight_nested_code,
                                blocksize=NESTED_BLOCKSIZE, dtype=torch.float32)
        return QuantState(absmax=self.weight_absmax, shape=torch.Size([self.out_features, self.in_features]),
                          code=self.weight_code, blocksize=self.blocksize, quant_type=self.quant_type,
                          dtype=dtype or self.compute_dtype, offset=self.weight_offset if self.double_quant else None,
                          state2=state2)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight (out, in) the layer computes with, dequantized to `dtype`."""
        from bitsandbytes.functional import dequantize_4bit

        return dequantize_4bit(self.weight_4bit, self.quant_state(dtype)).to(dtype)

    def base_forward(self, x: torch.Tensor) -> torch.Tensor:
        import bitsandbytes as bnb

        bias = self.bias.to(self.compute_dtype) if self.bias is not None else None
        # matmul_4bit's backward dequantizes again instead of saving the full-precision weight,
        # which is where QLoRA's memory saving during training comes from.
        return bnb.matmul_4bit(x.to(self.compute_dtype), self.weight_4bit, quant_state=self.quant_state(), bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_forward(x).to(x.dtype)

    def to_linear(self, dtype: torch.dtype = torch.float32) -> nn.Linear:
        """A plain nn.Linear holding the dequantized weight (and the bias, cast to `dtype`)."""
        lin = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        lin.weight = nn.Parameter(self.dequantized_weight(dtype), requires_grad=False)
        if self.bias is not None:
            lin.bias = nn.Parameter(self.bias.detach().to(dtype), requires_grad=False)
        if hasattr(self, "is_residual_proj"):
            lin.is_residual_proj = self.is_residual_proj
        return lin

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"{self.quant_type}, double_quant={self.double_quant}, compute_dtype={self.compute_dtype}")


class LoRALinear4bit(Linear4bit):
    """Linear4bit plus LoRA adapters in full precision (QLoRA eq. 5).

    forward: x (..., in) -> (..., out) = base_forward(x) + scaling * (dropout(x) @ A^T) @ B^T.
    Parameters lora_A (r, in), lora_B (out, r): initialised as `lora.LoRALinear`'s (Kaiming-uniform
    A, zero B, drawn from the same generator in the same order), so a QLoRA model starts from its
    dequantized base exactly.
    """

    def add_adapter(self, rank: int, alpha: float, dropout: float, dtype: torch.dtype,
                    device: torch.device | str) -> None:
        self.lora_A = nn.Parameter(torch.empty(rank, self.in_features, dtype=dtype, device=device))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, dtype=dtype, device=device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scaling = alpha / rank
        self.lora_dropout = nn.Dropout(dropout)

    adapter_enabled: bool = True
    """False inside `gptforge.model.lora.adapters_disabled`: the 4-bit base alone."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base_forward(x).to(x.dtype)
        if not self.adapter_enabled:
            return out
        return out + F.linear(F.linear(self.lora_dropout(x), self.lora_A), self.lora_B) * self.scaling

    def delta_weight(self) -> torch.Tensor:
        """scaling * B @ A, shape (out, in): what merging adds to the dequantized weight."""
        return (self.lora_B.float() @ self.lora_A.float()) * self.scaling

    def to_linear(self, dtype: torch.dtype = torch.float32) -> LoRALinear:
        """A `lora.LoRALinear` on the dequantized weight, sharing this layer's adapters."""
        lora = LoRALinear.__new__(LoRALinear)
        nn.Module.__init__(lora)
        plain = super().to_linear(dtype)
        lora.in_features, lora.out_features = self.in_features, self.out_features
        lora.weight, lora.bias = plain.weight, plain.bias
        if hasattr(self, "is_residual_proj"):
            lora.is_residual_proj = self.is_residual_proj
        lora.lora_A, lora.lora_B = self.lora_A, self.lora_B
        lora.scaling, lora.lora_dropout = self.scaling, self.lora_dropout
        return lora

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.lora_A.shape[0]}, scaling={self.scaling:g}"


def block_linears(model: nn.Module) -> list[str]:
    """Names of the blocks' linear layers that QLoRA stores in 4 bits (q/k/v/o, gate/up/down)."""
    return [n for n, m in model.named_modules()
            if n.startswith("blocks.") and n.rsplit(".", 1)[-1] in LORA_TARGETS
            and isinstance(m, (nn.Linear, Linear4bit))]


def apply_qlora(model: nn.Module, lora_cfg: LoRAConfig, qcfg: QuantConfig, device: torch.device | str = "cpu",
                quantize: bool = True, modules: list[str] | None = None, progress: bool = False) -> list[str]:
    """Store every block linear of `model` in 4 bits and put LoRA adapters on the targets.

    quantize=True quantizes the current weights on `device` (where the packed weights then live;
    the adapters are made on the original weights' device, like `lora.apply_lora`). quantize=False
    only allocates the 4-bit buffers (uninitialised) for a checkpoint to fill: resume and export,
    without needing the original weights. `modules`: the layer names to store in 4 bits (default
    `block_linears(model)`; export passes the checkpoint's). Everything but the adapters is frozen.
    Returns the adapted module names.

    Raises:
        ValueError: a bad config, a model already adapted, or targets that match nothing.
        QLoRAUnavailable: bitsandbytes missing (only when quantize=True).
    """
    targets = set(lora_cfg.targets())
    qcfg.validate()
    if any(isinstance(m, (LoRALinear, Linear4bit)) for m in model.modules()):
        raise ValueError("model already has LoRA adapters or 4-bit layers")
    if quantize:
        import_bitsandbytes()
    names = block_linears(model) if modules is None else list(modules)
    for p in model.parameters():
        p.requires_grad_(False)
    done = []
    from gptforge.progress import track

    for name in track(names, "quantizing to 4 bits", unit="layers", enabled=progress):
        module = model.get_submodule(name)
        if not isinstance(module, nn.Linear):
            raise ValueError(f"{name}: expected a linear layer to quantize, found {type(module).__name__}")
        parent_name, leaf = name.rsplit(".", 1)
        cls = LoRALinear4bit if leaf in targets else Linear4bit
        bias = module.bias
        if quantize:
            new = cls.from_weight(module.weight, bias, qcfg, device)
        else:
            new = cls(module.in_features, module.out_features, bias is not None, qcfg, device=module.weight.device,
                      bias_dtype=bias.dtype if bias is not None else torch.float32)
        if hasattr(module, "is_residual_proj"):
            new.is_residual_proj = module.is_residual_proj
        if isinstance(new, LoRALinear4bit):
            new.add_adapter(lora_cfg.rank, lora_cfg.alpha, lora_cfg.dropout, module.weight.dtype, module.weight.device)
            done.append(name)
        setattr(model.get_submodule(parent_name), leaf, new)
    if not done:
        raise ValueError(f"lora.target_modules {sorted(targets)} matched no linear layer of this model")
    return done


@torch.no_grad()
def dequantize_model(model: nn.Module, dtype: torch.dtype | None = None) -> int:
    """Replace every 4-bit layer by its dequantized equivalent: `Linear4bit` -> nn.Linear,
    `LoRALinear4bit` -> `lora.LoRALinear` (same adapters), so `lora.merge_lora` can fold the
    adapters in. `dtype`: of the dequantized weights (default: the model's first floating-point
    parameter's). Returns the number of layers replaced.

    The weights are dequant(W), what the QLoRA model computed with, not the weights it was
    quantized from (those are not kept).
    """
    if dtype is None:
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    n = 0
    for name, module in list(model.named_modules()):
        if isinstance(module, Linear4bit):
            parent_name, leaf = name.rsplit(".", 1)
            setattr(model.get_submodule(parent_name), leaf, module.to_linear(dtype))
            n += 1
    return n
