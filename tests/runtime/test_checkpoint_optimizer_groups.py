"""An optimizer whose parameter groups include an empty one checkpoints and resumes (issue 15, item 12).

A ZeRO-1 rank's local optimizer gets such a group when `ZeroRedundancyOptimizer` splits a small
group over many ranks; torch's flattened optimizer state dict could not load it (an IndexError
in DCP's `_unflatten_optim_state_dict`). The 4-rank runs are in tests/train/test_distributed.py.
"""

from __future__ import annotations

import torch

from gptforge.runtime import checkpoint as ck


def _tiny_optimizer(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    lin, norm = model[0], model[1]
    # [matrices], [] (what a ZeRO-1 rank can hold), [vectors]
    opt = torch.optim.AdamW([{"params": [lin.weight], "weight_decay": 0.1}, {"params": [], "weight_decay": 0.5},
                             {"params": [lin.bias, norm.weight, norm.bias], "weight_decay": 0.0}], lr=1e-2)
    return model, opt


def _step(model, opt):
    torch.manual_seed(0)
    model(torch.randn(5, 4)).square().sum().backward()
    opt.step()
    opt.zero_grad()


def test_optimizer_with_an_empty_group_saves_and_loads(tmp_path):
    model, opt = _tiny_optimizer(1)
    for _ in range(2):
        _step(model, opt)
    ck.save_checkpoint(tmp_path / "ck", 2, model, opt, {"step": 2}, "x: 1\n")
    model2, opt2 = _tiny_optimizer(2)
    state = ck.load_checkpoint(ck.find_checkpoint(tmp_path / "ck"), model2, opt2)
    assert state["step"] == 2
    assert [len(g["params"]) for g in opt2.param_groups] == [1, 0, 3]  # the empty group kept its place
    assert [g["weight_decay"] for g in opt2.param_groups] == [0.1, 0.5, 0.0]
    for p, q in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(p, q)
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p][k], opt2.state[q][k])
    _step(model, opt)
    _step(model2, opt2)  # both continue alike
    for p, q in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(p, q)
