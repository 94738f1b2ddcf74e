import pytest
import torch

from gptforge.config import ModelConfig, TrainConfig
from gptforge.model import GPT
from gptforge.train.optim import build_optimizer, lr_at, param_groups


def test_weight_decay_only_on_matrices():
    m = GPT(ModelConfig(n_layer=1, n_head=2, d_model=16, vocab_size=40, block_size=8).resolved())
    decay, no_decay = param_groups(m, 0.1)
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.1
    n = sum(p.numel() for g in (decay, no_decay) for p in g["params"])
    assert n == m.num_params()  # tied embedding counted once
    opt = build_optimizer(m, TrainConfig(), "cpu")
    assert isinstance(opt, torch.optim.AdamW)
    with pytest.raises(ValueError, match="adafactor"):
        build_optimizer(m, TrainConfig(optimizer="adafactor"), "cpu")


def test_schedules():
    c = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=110)
    assert lr_at(0, c) == pytest.approx(0.1) and lr_at(9, c) == pytest.approx(1.0)
    assert lr_at(60, c) == pytest.approx(0.55)  # halfway through cosine
    assert lr_at(110, c) == pytest.approx(0.1)
    lin = TrainConfig(lr=1.0, min_lr=0.0, warmup_steps=0, max_steps=100, lr_schedule="linear")
    assert lr_at(25, lin) == pytest.approx(0.75)
    assert lr_at(50, TrainConfig(lr=2.0, warmup_steps=0, lr_schedule="constant")) == 2.0
    wsd = TrainConfig(lr=1.0, min_lr=0.0, warmup_steps=10, max_steps=100, lr_schedule="wsd", decay_fraction=0.2)
    assert lr_at(50, wsd) == 1.0 and lr_at(79, wsd) == 1.0
    assert lr_at(89, wsd) == pytest.approx(0.5) and lr_at(99, wsd) == pytest.approx(0.0)


def test_schedule_start_counts_warmup_and_decay_from_that_step():
    base = dict(lr=1.0, min_lr=0.0, warmup_steps=10, max_steps=110)
    fresh = TrainConfig(**base)
    moved = TrainConfig(lr=1.0, min_lr=0.0, warmup_steps=10, max_steps=1110, schedule_start=1000)
    for s in (0, 5, 9, 10, 60, 109):
        assert lr_at(1000 + s, moved) == pytest.approx(lr_at(s, fresh))
    assert lr_at(1000, moved) == pytest.approx(0.1)  # a fresh warmup at the resume step
    assert lr_at(500, moved) == pytest.approx(0.1)  # before the start: the schedule's first value
    # WSD cooldown from a checkpoint: linear from lr to min_lr over the remaining steps.
    cool = TrainConfig(lr=1.0, min_lr=0.0, warmup_steps=0, max_steps=200, lr_schedule="wsd", decay_fraction=1.0,
                       schedule_start=100)
    assert lr_at(100, cool) == pytest.approx(0.99) and lr_at(149, cool) == pytest.approx(0.5)
    assert lr_at(199, cool) == pytest.approx(0.0)
    from gptforge.train.optim import describe_schedule

    assert "wsd from step 100 to 200" in describe_schedule(cool)
    from gptforge.errors import InputError

    with pytest.raises(InputError, match="schedule_start"):
        TrainConfig(max_steps=10, schedule_start=10).check_trainable()
