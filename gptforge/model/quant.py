"""Post-training weight quantization layers: int8, int4 and NF4 linears, int8 embeddings.

Formats (W is a linear weight (out, in); round-to-nearest, no calibration of the weights):

- int8: per-output-channel symmetric. s_o = max_i |W_oi| / 127, q = clamp(round(W / s_o), -127, 127)
  stored int8, s fp32 (out,). |W - q s| <= s / 2. On CPU the forward quantizes each activation
  row (token) the same way, dynamically, multiplies int8 x int8 -> int32 with `torch._int_mm` and
  rescales by s_x s_o (the "dynamic quantization" of Jacob et al. 2018 / PyTorch's
  `quantize_dynamic`, computed here with torch's int8 GEMM on plain tensors). Elsewhere it runs on
  the dequantized weight.
- int4: group-wise asymmetric. Each row is cut into groups of `group_size` inputs; per group
  scale = (max - min) / 15, zero = -min / scale, q = clamp(round(W / scale + zero), 0, 15),
  W ~ (q - zero) scale; |W - deq| <= scale / 2 (plus fp16 rounding of scale and zero). Two codes
  per byte (even input index in the low nibble), scale and zero stored fp16 (out, in / group_size):
  4 + 32 / group_size bits per weight. On a CPU under no_grad, when out % 16 == 0 and the group
  is 32/64/128/256, the forward runs torch's int4 kernel (`torch._weight_int4pack_mm_for_cpu`,
  bf16 activations, the weight repacked once into its layout); otherwise it dequantizes the
  weight to the activations' dtype.
- nf4: bitsandbytes' 4-bit NormalFloat (Dettmers et al. 2023, section 3) through
  `gptforge.model.qlora.Linear4bit`, blocks of `group_size` weights sharing one absmax.
- Embeddings (with `quantize_embeddings`): int8 per row (per token), symmetric, like int8 above.

All packed tensors are plain registered buffers whose shapes depend only on the layer's shape and
the format, so `torch.distributed.checkpoint` saves and reloads them in place like any tensor:
`quantize_model(model, spec)` quantizes weights, `quantize_model(model, spec, allocate_only=True)`
builds the empty layers a checkpoint then fills.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F

METHODS = ("int8", "int4", "nf4")


@dataclass
class QuantSpec:
    """How a run's weights are quantized; stored as the `quantization` section of config.yaml."""

    method: str
    """int8, int4 or nf4."""
    group_size: int = 128
    """int4 / nf4: input weights per scale (int8 uses one scale per output channel)."""
    quantize_embeddings: bool = False
    """Also quantize the token embedding (int8 per row) and the output head (in `method`)."""

    def validate(self) -> None:
        """Raises ValueError naming the bad field."""
        if self.method not in METHODS:
            raise ValueError(f"--method {self.method!r}: choose one of {', '.join(METHODS)}")
        if self.group_size < 2 or self.group_size % 2:
            raise ValueError(f"--group-size {self.group_size}: must be an even number >= 2")
        if self.method == "nf4" and self.group_size not in (32, 64, 128, 256, 512, 1024, 2048, 4096):
            raise ValueError(f"--group-size {self.group_size}: nf4 (bitsandbytes) needs a power of two from 32 to 4096")

    def as_dict(self) -> dict:
        return asdict(self)


def _int8_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row of w (R, C): (q int8 (R, C), scale fp32 (R,))."""
    w = w.detach().float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


class Int8Linear(nn.Module):
    """Linear with an int8 per-output-channel weight. x (..., in) -> (..., out) in x's dtype.

    Buffers: weight_int8 int8 (out, in), weight_scale fp32 (out,); `bias` a frozen parameter.
    """

    weight_int8: torch.Tensor
    weight_scale: torch.Tensor
    bias: nn.Parameter | None

    def __init__(self, in_features: int, out_features: int, bias: bool, device=None,
                 bias_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight_int8", torch.zeros(out_features, in_features, dtype=torch.int8, device=device))
        self.register_buffer("weight_scale", torch.ones(out_features, dtype=torch.float32, device=device))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=bias_dtype, device=device),
                                 requires_grad=False) if bias else None

    quantized_numel = property(lambda self: self.in_features * self.out_features)

    @classmethod
    def from_linear(cls, lin: nn.Linear) -> "Int8Linear":
        layer = cls(lin.in_features, lin.out_features, lin.bias is not None, device=lin.weight.device,
                    bias_dtype=lin.bias.dtype if lin.bias is not None else torch.float32)
        q, s = _int8_rows(lin.weight)
        layer.weight_int8.copy_(q)
        layer.weight_scale.copy_(s)
        if lin.bias is not None:
            layer.bias.data.copy_(lin.bias.detach())
        return layer

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(out, in) = q * s."""
        return (self.weight_int8.float() * self.weight_scale[:, None]).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or not x.is_floating_point():
            return F.linear(x, self.dequantized_weight(x.dtype), None if self.bias is None else self.bias.to(x.dtype))
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).float()
        # Dynamic per-token activation scale, then an int8 GEMM accumulating in int32.
        sx = (x2.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=1e-12)
        xq = torch.round(x2 / sx).clamp(-127, 127).to(torch.int8)
        y = torch._int_mm(xq, self.weight_int8.t()).float() * sx * self.weight_scale
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype).reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, int8"


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Codes q (R, C) with values 0..15, C even -> uint8 (R, C / 2); code 2j in the low nibble.

    Raises:
        ValueError: C odd or a code outside 0..15.
    """
    if q.shape[-1] % 2:
        raise ValueError(f"int4 packing needs an even number of columns, got {q.shape[-1]}")
    if q.numel() and (int(q.min()) < 0 or int(q.max()) > 15):
        raise ValueError("int4 codes must lie in 0..15")
    q = q.to(torch.uint8)
    return q[..., 0::2] | (q[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 (R, C / 2) -> codes uint8 (R, C), the inverse of `pack_int4`."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def quantize_int4(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group-wise asymmetric 4-bit codes of w (R, C) (see the module docstring).

    Returns: (codes uint8 (R, C) in 0..15, scale fp16 (R, C / g), zero fp16 (R, C / g)).

    Raises:
        ValueError: C not a multiple of group_size.
    """
    R, C = w.shape
    if C % group_size:
        raise ValueError(f"--group-size {group_size} does not divide the layer's input width {C}; "
                         "choose a group size that divides every block linear's input width")
    g = w.detach().float().reshape(R, C // group_size, group_size)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    scale = ((hi - lo) / 15.0).clamp(min=1e-8).half()
    zero = (-lo / scale.float()).half()  # rounded to fp16 first: the codes use the stored values
    s, z = scale.float()[..., None], zero.float()[..., None]
    q = torch.round(g / s + z).clamp(0, 15).to(torch.uint8).reshape(R, C)
    return q, scale, zero


def dequantize_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """codes (R, C), scale and zero (R, C / g) -> fp32 (R, C) = (q - zero) * scale."""
    R, C = q.shape
    g = C // scale.shape[1]
    out = (q.float().reshape(R, -1, g) - zero.float()[..., None]) * scale.float()[..., None]
    return out.reshape(R, C)


class Int4Linear(nn.Module):
    """Linear with a group-wise asymmetric int4 weight, two codes per byte.

    Buffers: weight_packed uint8 (out, in / 2), weight_scale fp16 (out, in / g), weight_zero fp16
    (out, in / g). forward: x (..., in) -> (..., out) with the weight dequantized to x's dtype.
    """

    weight_packed: torch.Tensor
    weight_scale: torch.Tensor
    weight_zero: torch.Tensor
    bias: nn.Parameter | None
    _kernel_weight: tuple[torch.Tensor, torch.Tensor] | None

    def __init__(self, in_features: int, out_features: int, bias: bool, group_size: int, device=None,
                 bias_dtype: torch.dtype = torch.float32):
        super().__init__()
        if in_features % group_size:
            raise ValueError(f"--group-size {group_size} does not divide the input width {in_features}")
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        n_groups = in_features // group_size
        self.register_buffer("weight_packed", torch.zeros(out_features, in_features // 2, dtype=torch.uint8,
                                                          device=device))
        self.register_buffer("weight_scale", torch.ones(out_features, n_groups, dtype=torch.float16, device=device))
        self.register_buffer("weight_zero", torch.zeros(out_features, n_groups, dtype=torch.float16, device=device))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=bias_dtype, device=device),
                                 requires_grad=False) if bias else None

    quantized_numel = property(lambda self: self.in_features * self.out_features)

    @classmethod
    def from_linear(cls, lin: nn.Linear, group_size: int) -> "Int4Linear":
        layer = cls(lin.in_features, lin.out_features, lin.bias is not None, group_size, device=lin.weight.device,
                    bias_dtype=lin.bias.dtype if lin.bias is not None else torch.float32)
        q, s, z = quantize_int4(lin.weight, group_size)
        layer.weight_packed.copy_(pack_int4(q))
        layer.weight_scale.copy_(s)
        layer.weight_zero.copy_(z)
        if lin.bias is not None:
            layer.bias.data.copy_(lin.bias.detach())
        return layer

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize_int4(unpack_int4(self.weight_packed), self.weight_scale, self.weight_zero).to(dtype)

    @property
    def cpu_kernel_fits(self) -> bool:
        """Shapes torch's CPU int4 matmul accepts: out_features % 16 == 0, group 32/64/128/256."""
        return self.out_features % 16 == 0 and self.group_size in (32, 64, 128, 256)

    def _cpu_kernel_weight(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This weight in the layout of torch's `_weight_int4pack_mm_for_cpu`, built on first use
        and kept (not saved: the checkpoint holds `weight_packed`). torch dequantizes as
        (q - 8) * scale + zero', so zero' = (8 - zero) * scale."""
        if getattr(self, "_kernel_weight", None) is None:
            q = unpack_int4(self.weight_packed).to(torch.int32)
            scale = self.weight_scale.float()
            zero = (8.0 - self.weight_zero.float()) * scale
            packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
            sz = torch.stack((scale.t(), zero.t()), dim=-1).contiguous().to(torch.bfloat16)  # (in/g, out, 2)
            self._kernel_weight = (packed, sz)
        return self._kernel_weight

    def _load_from_state_dict(self, *args, **kwargs):
        self._kernel_weight = None  # new codes: rebuild the kernel layout on the next forward
        super()._load_from_state_dict(*args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if x.device.type == "cpu" and x.is_floating_point() and self.cpu_kernel_fits and not torch.is_grad_enabled():
            # torch's int4 CPU kernel: bf16 activations times the packed weight, no dequantized copy.
            packed, sz = self._cpu_kernel_weight()
            shape = x.shape
            y = torch._weight_int4pack_mm_for_cpu(x.reshape(-1, shape[-1]).to(torch.bfloat16), packed,
                                                  self.group_size, sz).to(x.dtype)
            y = y.reshape(*shape[:-1], self.out_features)
            return y if bias is None else y + bias
        return F.linear(x, self.dequantized_weight(x.dtype), bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"int4 group_size={self.group_size}")


class Int8Embedding(nn.Module):
    """Token embedding stored int8 per row. idx (B, T) int64 -> (B, T, C) fp32.

    Buffers: weight_int8 int8 (V, C), weight_scale fp32 (V,).
    """

    weight_int8: torch.Tensor
    weight_scale: torch.Tensor

    def __init__(self, num_embeddings: int, embedding_dim: int, device=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.register_buffer("weight_int8", torch.zeros(num_embeddings, embedding_dim, dtype=torch.int8,
                                                        device=device))
        self.register_buffer("weight_scale", torch.ones(num_embeddings, dtype=torch.float32, device=device))

    quantized_numel = property(lambda self: self.num_embeddings * self.embedding_dim)

    @classmethod
    def from_embedding(cls, emb: nn.Embedding) -> "Int8Embedding":
        layer = cls(emb.num_embeddings, emb.embedding_dim, device=emb.weight.device)
        q, s = _int8_rows(emb.weight)
        layer.weight_int8.copy_(q)
        layer.weight_scale.copy_(s)
        return layer

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.weight_int8.float() * self.weight_scale[:, None]).to(dtype)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return F.embedding(idx, self.weight_int8).float() * self.weight_scale[idx][..., None]


QUANTIZED_TYPES = (Int8Linear, Int4Linear, Int8Embedding)


def quantized_linear_names(model: nn.Module, spec: QuantSpec) -> list[str]:
    """The linear layers `spec` quantizes: every nn.Linear inside the blocks (q/k/v/o, gate/up/down
    or fc/proj: all of them), plus `lm_head` with quantize_embeddings."""
    names = [n for n, m in model.named_modules() if n.startswith("blocks.") and isinstance(m, nn.Linear)]
    if spec.quantize_embeddings:
        names.append("lm_head")
    return names


def _linear_for(lin: nn.Linear, spec: QuantSpec, allocate_only: bool) -> nn.Module:
    bias_dtype = lin.bias.dtype if lin.bias is not None else torch.float32
    if spec.method == "int8":
        if allocate_only:
            return Int8Linear(lin.in_features, lin.out_features, lin.bias is not None, lin.weight.device, bias_dtype)
        return Int8Linear.from_linear(lin)
    if spec.method == "int4":
        if allocate_only:
            return Int4Linear(lin.in_features, lin.out_features, lin.bias is not None, spec.group_size,
                              lin.weight.device, bias_dtype)
        return Int4Linear.from_linear(lin, spec.group_size)
    from gptforge.model.qlora import Linear4bit, QuantConfig

    qcfg = QuantConfig(quant_type="nf4", double_quant=False, compute_dtype="fp32", blocksize=spec.group_size)
    if allocate_only:
        return Linear4bit(lin.in_features, lin.out_features, lin.bias is not None, qcfg, lin.weight.device, bias_dtype)
    return Linear4bit.from_weight(lin.weight, lin.bias, qcfg)


@torch.no_grad()
def quantize_model(model: nn.Module, spec: QuantSpec, allocate_only: bool = False) -> list[str]:
    """Replace the layers `spec` names (see `quantized_linear_names`; and `wte` with
    quantize_embeddings) by quantized ones, in place. allocate_only builds them empty, for a
    checkpoint to fill. The output head of a model with tied embeddings gets its own quantized
    copy. Everything left (norms, positions, embeddings without quantize_embeddings) is frozen
    too: a quantized model is for inference. Returns the replaced module names.

    Raises:
        ValueError: a bad spec, a model already quantized, or a group size that does not divide a
            layer's input width. QLoRAUnavailable: nf4 without bitsandbytes.
    """
    from gptforge.model.qlora import Linear4bit

    spec.validate()
    if any(isinstance(m, QUANTIZED_TYPES + (Linear4bit,)) for m in model.modules()):
        raise ValueError("this model is already quantized; quantize the original run instead")
    names = quantized_linear_names(model, spec)
    if spec.method == "int4":  # (bitsandbytes' nf4 blocks run over the flattened weight)
        widths = {cast(nn.Linear, model.get_submodule(n)).in_features for n in names}
        bad = sorted(w for w in widths if w % spec.group_size)
        if bad:
            fits = [g for g in (256, 128, 64, 32, 16, 8) if all(w % g == 0 for w in widths)]
            hint = f"the largest group size that divides them all is {fits[0]}" if fits else "no power of two from 8 up divides them all"
            raise ValueError(f"--group-size {spec.group_size} does not divide the input width(s) {bad} of this "
                             f"model's linear layers; {hint}")
    for name in names:
        parent_name, leaf = name.rsplit(".", 1) if "." in name else ("", name)
        lin = cast(nn.Linear, model.get_submodule(name))  # quantized_linear_names lists nn.Linear layers
        new = _linear_for(lin, spec, allocate_only)
        if hasattr(lin, "is_residual_proj"):
            new.is_residual_proj = lin.is_residual_proj
        setattr(model.get_submodule(parent_name) if parent_name else model, leaf, new)
    if spec.quantize_embeddings:
        emb = cast(nn.Embedding, model.wte)
        model.wte = Int8Embedding(emb.num_embeddings, emb.embedding_dim, emb.weight.device) if allocate_only \
            else Int8Embedding.from_embedding(emb)
        names.append("wte")
    for p in model.parameters():
        p.requires_grad_(False)
    return names
