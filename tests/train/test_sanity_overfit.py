"""--sanity-overfit: a good model memorises one batch; models that cannot learn fail the check."""

from __future__ import annotations

import pytest
import torch

from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.model.gpt import GPT
from gptforge.train.sources.fixed import FixedBatches
from gptforge.train.workflows.sanity import sanity_overfit


def _cfg(steps: int = 60) -> RunConfig:
    return RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32, dropout=0.0),
                     train=TrainConfig(max_steps=steps, micro_batch_size=2, lr=3e-3, warmup_steps=5,
                                       lr_schedule="constant", weight_decay=0.0, tensorboard=False))


def test_a_good_model_passes(tiny_shards, tmp_path):
    r = sanity_overfit(_cfg(), tiny_shards, tmp_path / "run", progress=False)
    assert r.passed, r.summary()
    assert r.final_loss < 0.1 < r.first_loss


def test_labels_reshuffled_at_every_step_fail(tiny_shards, tmp_path, monkeypatch):
    real = FixedBatches.micro_batches

    def shuffled(self, step):
        g = torch.Generator().manual_seed(step)
        return [(x, y.flatten()[torch.randperm(y.numel(), generator=g)].view_as(y)) for x, y in real(self, step)]

    monkeypatch.setattr(FixedBatches, "micro_batches", shuffled)
    r = sanity_overfit(_cfg(), tiny_shards, tmp_path / "run", progress=False)
    assert not r.passed and "not below 0.1" in r.reason
    assert any("labels that change" in a for a in r.advice)


def test_every_label_ignored_fails(tiny_shards, tmp_path, monkeypatch):
    real = FixedBatches.micro_batches
    monkeypatch.setattr(FixedBatches, "micro_batches",
                        lambda self, step: [(x, torch.full_like(y, -100)) for x, y in real(self, step)])
    r = sanity_overfit(_cfg(10), tiny_shards, tmp_path / "run", progress=False)
    assert not r.passed and "no target token counts" in r.reason


class _Detached(GPT):
    def forward(self, *a, **k):
        return super().forward(*a, **k).detach().requires_grad_()  # no gradient reaches a weight


def test_detached_gradients_fail(tiny_shards, tmp_path):
    r = sanity_overfit(_cfg(), tiny_shards, tmp_path / "run", progress=False, model_factory=_Detached)
    assert not r.passed
    assert r.final_loss == pytest.approx(r.first_loss, abs=0.5)


def test_the_cli_exits_non_zero_with_what_to_check(tiny_shards, tmp_path, capsys):
    from gptforge.cli import main

    args = ["pretrain", "--data", str(tiny_shards), "--out", str(tmp_path / "r"), "--model.preset", "gpt2-nano",
            "--model.block_size", "32", "--train.max_steps", "3", "--train.micro_batch_size", "2",
            "--sanity-overfit", "--quiet"]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "sanity check FAILED" in out and "train.lr" in out
