import copy

import torch

from gptforge.config import ModelConfig, TrainConfig
from gptforge.model import GPT
from gptforge.runtime.loss import IGNORE_INDEX, count_targets
from gptforge.train.optim import build_optimizer
from gptforge.train.step import forward_backward


def test_accumulated_update_equals_big_batch_with_uneven_target_counts():
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=2, d_model=32, block_size=16, vocab_size=64).resolved()
    a = GPT(cfg)
    b = copy.deepcopy(a)
    x = torch.randint(0, 64, (8, 16))
    y = torch.randint(0, 64, (8, 16))
    # Uneven masking: micro-batches hold very different numbers of target tokens.
    y[0, :15] = IGNORE_INDEX
    y[2:4, 3:] = IGNORE_INDEX
    y[7, :] = IGNORE_INDEX
    micro = [(x[i : i + 2], y[i : i + 2]) for i in range(0, 8, 2)]
    big = [(x, y)]
    # SGD: the update is lr * gradient, so it compares the accumulated gradients themselves (Adam's
    # first step is lr * sign(g) and flips on gradients that are zero up to rounding).
    tc = TrainConfig(lr=1e-2, weight_decay=0.0, optimizer="sgd")
    opt_a, opt_b = build_optimizer(a, tc, "cpu"), build_optimizer(b, tc, "cpu")
    la = forward_backward(a, micro, count_targets(micro), torch.device("cpu"))
    lb = forward_backward(b, big, count_targets(big), torch.device("cpu"))
    torch.testing.assert_close(la, lb, rtol=1e-6, atol=0)
    for (n, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert (pa.grad - pb.grad).norm() <= 1e-6 * pb.grad.norm(), n
    before = [p.detach().clone() for p in a.parameters()]
    opt_a.step()
    opt_b.step()
    for p0, pa, pb in zip(before, a.parameters(), b.parameters(), strict=True):
        assert not torch.equal(pb, p0)  # the step changed the weights
        # Equal up to fp32 rounding of p + update (the update is ~1e-3 of |p|).
        torch.testing.assert_close(pa, pb, rtol=1e-6, atol=1e-10)
    # A mean of micro-batch means would differ here: make sure this test can tell.
    means = torch.stack([torch.nn.functional.cross_entropy(a(xx).reshape(-1, 64), yy.reshape(-1),
                                                           ignore_index=IGNORE_INDEX) for xx, yy in micro[1:]])
    assert not torch.allclose(means.mean(), la / count_targets(micro))
