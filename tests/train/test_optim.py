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
    opt = build_optimizer(m, TrainConfig(lr=6e-4), "cpu")
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


def test_size_aware_defaults_follow_the_documented_rule():
    from gptforge.train.optim import default_lr, describe_defaults, resolve_defaults

    tc = TrainConfig(max_steps=2000)
    assert tc.lr is None and tc.warmup_steps is None and tc.min_lr is None
    small = resolve_defaults(ModelConfig(preset="gpt2-small"), tc)
    nano = resolve_defaults(ModelConfig(preset="gpt2-nano"), tc)
    # The documented values of lr = 0.0016 * (128 / d_model)^0.6.
    assert (small.lr, nano.lr) == (0.00055, 0.0024)
    assert [default_lr(d, 1000) for d in (32, 128, 256, 384)] == [0.0037, 0.0016, 0.0011, 0.00083]
    assert default_lr(2, 1000) == 0.01  # capped
    assert nano.min_lr == pytest.approx(nano.lr / 10) and nano.warmup_steps == 100  # 5% of 2000
    assert resolve_defaults(ModelConfig(d_model=64), TrainConfig(max_steps=100)).warmup_steps == 10
    assert resolve_defaults(ModelConfig(d_model=64), TrainConfig(max_steps=20)).warmup_steps == 5  # <= a quarter
    assert resolve_defaults(ModelConfig(d_model=64), TrainConfig(max_steps=10**6)).warmup_steps == 1000
    # Given values are kept; a resume takes the frozen ones from the checkpoint's config.yaml.
    given = resolve_defaults(ModelConfig(d_model=64), TrainConfig(lr=1e-3, warmup_steps=7, max_steps=100))
    assert (given.lr, given.min_lr, given.warmup_steps) == (1e-3, pytest.approx(1e-4), 7)
    resumed = resolve_defaults(ModelConfig(d_model=64), TrainConfig(max_steps=5000),
                               saved={"lr": 0.004, "min_lr": 0.0004, "warmup_steps": 50, "muon_lr": 0.03})
    assert (resumed.lr, resumed.warmup_steps, resumed.muon_lr) == (0.004, 50, 0.03)
    line = describe_defaults(tc, nano)
    assert line.startswith("size-aware defaults: lr ") and "warmup_steps 100" in line
    assert describe_defaults(given, given) == ""
    # Unresolved: no fixed fallback any more (issue 22: one resolution, gptforge.train.resolve).
    with pytest.raises(ValueError, match="train.lr, train.min_lr, train.warmup_steps unset"):
        lr_at(99, TrainConfig(max_steps=1000))
    with pytest.raises(ValueError, match="train.lr unset"):
        build_optimizer(GPT(ModelConfig(n_layer=1, n_head=2, d_model=16, vocab_size=40, block_size=8).resolved()),
                        TrainConfig(), "cpu")
