"""Linear layers through oneDNN in fp32 CPU training steps (gptforge.runtime.onednn_linear)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gptforge.runtime.onednn_linear import OneDNNLinear, onednn_linear, onednn_linear_available

pytestmark = pytest.mark.skipif(not onednn_linear_available(), reason="this torch build has no oneDNN")


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(37, 24), (3, 11, 24)])
def test_values_and_gradients_equal_the_blas(bias, shape):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g, requires_grad=True)
    w = torch.randn(40, 24, generator=g, requires_grad=True)
    b = torch.randn(40, generator=g, requires_grad=True) if bias else None
    up = torch.randn(*shape[:-1], 40, generator=g)
    ref = F.linear(x, w, b)
    ref_grads = torch.autograd.grad(ref, [t for t in (x, w, b) if t is not None], up)
    out = OneDNNLinear.apply(x, w, b)
    grads = torch.autograd.grad(out, [t for t in (x, w, b) if t is not None], up)
    assert out.shape == ref.shape and out.grad_fn.name() == "OneDNNLinearBackward"
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for a, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-4)


def test_a_frozen_weight_gets_no_gradient_and_the_input_still_does():
    layer = torch.nn.Linear(16, 8)
    layer.weight.requires_grad_(False)
    x = torch.randn(5, 16, requires_grad=True)
    with onednn_linear():
        y = layer(x)
    assert y.grad_fn.name() == "OneDNNLinearBackward"
    y.sum().backward()
    assert layer.weight.grad is None and layer.bias.grad is not None and x.grad is not None
    torch.testing.assert_close(x.grad, layer.weight.sum(0).expand(5, 16), rtol=1e-5, atol=1e-5)


def test_only_plain_cpu_fp32_linear_layers_change():
    layer = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16, requires_grad=True)
    with onednn_linear():
        assert layer(x).grad_fn.name() == "OneDNNLinearBackward"
        assert layer.double()(x.double()).grad_fn.name() != "OneDNNLinearBackward"  # another dtype
        layer.float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = layer(x)
        assert y.dtype == torch.bfloat16 and y.grad_fn.name() != "OneDNNLinearBackward"  # autocast keeps its path
        assert (x @ x.T).grad_fn.name() == "MmBackward0"  # other functions pass through
    with onednn_linear(enabled=False):
        assert layer(x).grad_fn.name() == "AddmmBackward0"
    assert layer(x).grad_fn.name() == "AddmmBackward0"  # nothing is left behind after the block


def test_a_training_step_matches_the_blas_one_with_activation_checkpointing():
    from gptforge.config import ModelConfig
    from gptforge.model.gpt import GPT
    from gptforge.runtime.activation import apply_activation_checkpointing
    from gptforge.train.step import forward_backward

    cfg = ModelConfig(arch="llama", n_layer=2, n_head=2, d_model=32, block_size=16, vocab_size=50).resolved()
    g = torch.Generator().manual_seed(0)
    micro = [(torch.randint(0, 50, (2, 16), generator=g), torch.randint(0, 50, (2, 16), generator=g))
             for _ in range(2)]
    grads, losses = [], []
    for dnn in (False, True):
        torch.manual_seed(0)
        model = GPT(cfg)
        apply_activation_checkpointing(model, "full")
        model.train()
        losses.append(forward_backward(model, micro, 64.0, torch.device("cpu"), use_onednn_linear=dnn))
        grads.append({n: p.grad for n, p in model.named_parameters()})
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)
    assert grads[0].keys() == grads[1].keys()
    for name, ref in grads[0].items():
        torch.testing.assert_close(grads[1][name], ref, rtol=1e-4, atol=1e-5, msg=name)
