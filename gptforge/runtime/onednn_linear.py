"""Linear layers of fp32 training steps on a CPU through oneDNN instead of the BLAS.

PyTorch's CPU build sends an fp32 `F.linear` and its gradients to MKL's sgemm (bf16 ones already go
to oneDNN). MKL chooses its kernels by CPU model: on an AMD EPYC with AVX-512 (bench/RESULTS.md,
issue 29) its `MKL_VERBOSE` banner names no vector extension ("Intel(R) Architecture processors"),
while oneDNN (also in every x86 build of torch) generates its kernels from the CPU's
instruction-set flags. Measured there at one thread, per call, fp32, best of 12: the forward product
x W^T and the input gradient g W ran 2-36% faster through oneDNN's inner product
(`torch.ops.mkldnn._linear_pointwise`), the weight gradient g^T x 0-30% slower (oneDNN needs both
operands transposed into copies), so the weight gradient stays on torch's matmul.

`onednn_linear()` is a context in which `F.linear` (and so every `nn.Linear`, LoRA's included) over
plain CPU fp32 tensors runs `OneDNNLinear`; anything else (another dtype or device, autocast, tensor
subclasses such as FSDP2's and tensor parallel's DTensor, code being traced by torch.compile) goes
to `F.linear` unchanged. The values agree with the BLAS's to float rounding (relative 1e-6).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


def onednn_linear_available() -> bool:
    """Whether this torch build has oneDNN and its inner-product op (x86 and aarch64 builds do)."""
    try:
        return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


def _dnn(x2: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x2 (M, K) @ w (N, K)^T + b (N,) -> (M, N) through oneDNN's inner product."""
    return torch.ops.mkldnn._linear_pointwise(x2, w, b, "none", [], "")


class OneDNNLinear(torch.autograd.Function):
    """y = x W^T + b for x (..., K), W (N, K), b (N,) or None, fp32 on a CPU -> y (..., N).

    Forward and the input gradient (g W) run in oneDNN, the weight gradient (g^T x, summed over
    every leading position) and the bias gradient in torch. Not twice differentiable.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(x2, weight)
        ctx.x_shape, ctx.has_bias = x.shape, bias is not None
        return _dnn(x2, weight, bias).view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x2, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])
        need_x, need_w, need_b = ctx.needs_input_grad
        gx = _dnn(g2, weight.t(), None).view(ctx.x_shape) if need_x else None
        gw = g2.t() @ x2 if need_w else None
        gb = g2.sum(0) if need_b and ctx.has_bias else None
        return gx, gw, gb


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _applies(x, weight, bias) -> bool:
    plain = type(x) in _PLAIN and type(weight) in _PLAIN and (bias is None or type(bias) in _PLAIN)
    return (plain and x.device.type == "cpu" and weight.device.type == "cpu" and x.dtype == torch.float32
            and weight.dtype == torch.float32 and weight.dim() == 2 and x.dim() >= 1 and x.shape[-1] > 0
            and (bias is None or bias.dtype == torch.float32) and not torch.is_autocast_enabled("cpu")
            and not torch.compiler.is_compiling())


class _Mode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight = args[0], args[1] if len(args) > 1 else kwargs["weight"]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if _applies(x, weight, bias):
                return OneDNNLinear.apply(x, weight, bias)
        return func(*args, **kwargs)


_state = threading.local()


def onednn_linear_active() -> bool:
    """Whether this thread is inside an enabled `onednn_linear()` block. The autograd engine does
    not carry torch function modes into the backward pass, so activation checkpointing
    (gptforge.runtime.activation) asks this in the forward and recomputes inside the same mode."""
    return getattr(_state, "depth", 0) > 0


@contextlib.contextmanager
def onednn_linear(enabled: bool = True) -> Iterator[None]:
    """Within the block, fp32 CPU `F.linear` calls run `OneDNNLinear` (see the module docstring);
    with `enabled` False, or where `onednn_linear_available()` is False, nothing changes."""
    if not (enabled and onednn_linear_available()):
        yield
        return
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        with _Mode():
            yield
    finally:
        _state.depth -= 1
