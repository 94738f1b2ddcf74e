"""The absolute divergence rule (loss above ln(vocab) + 2 nats, from step 1, once per episode) and
one CPU matmul peak per process for precision auto and MFU."""

from __future__ import annotations

import math

import pytest
import torch

import gptforge.runtime.device as device_mod
from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.model.gpt import GPT
from gptforge.runtime.device import cpu_matmul_peak, resolve_precision
from gptforge.train.loggers import read_metrics
from gptforge.train.mfu import device_peak
from gptforge.train.rollback import rollback_trigger
from gptforge.train.run import train
from gptforge.train.spikes import DIVERGENCE_MARGIN_NATS, SpikeDetector, divergence_loss_ceiling


def test_ceiling_fires_from_the_first_step_once_per_episode():
    ceiling = divergence_loss_ceiling(384)
    assert ceiling == pytest.approx(math.log(384) + DIVERGENCE_MARGIN_NATS)
    det = SpikeDetector(loss_ceiling=ceiling)
    losses = [6.0, 57.0, 101.0, 137.0, 90.0, 5.0, 4.9, 30.0, 31.0]
    events = {s: det.update(s, {"loss": v, "grad_norm": 1.0}) for s, v in enumerate(losses, start=1)}
    fired = {s: ev for s, ev in events.items() if ev}
    assert sorted(fired) == [2, 8]  # the start of each episode, nothing while it lasts
    for ev in fired.values():
        (e,) = ev
        assert (e.kind, e.metric, e.ceiling) == ("divergence", "loss", ceiling)
        assert rollback_trigger([e.as_dict()], False) == "loss divergence"
        assert "ceiling" in e.message()
    # The episode state travels with the checkpoint: a resumed detector does not repeat the event.
    again = SpikeDetector(loss_ceiling=ceiling)
    again.load_state_dict(det.state_dict())
    assert again.update(10, {"loss": 40.0}) == []


def test_no_ceiling_without_a_vocab_figure():
    assert SpikeDetector().update(1, {"loss": 1e6}) == []
    with pytest.raises(ValueError):
        divergence_loss_ceiling(1)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_initial_loss_of_tiny_models_is_well_below_the_ceiling(seed):
    torch.manual_seed(seed)
    model = GPT(ModelConfig(preset="gpt2-nano", block_size=32, vocab_size=384).resolved())
    x = torch.randint(0, 384, (4, 32))
    with torch.no_grad():
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 384), torch.roll(x, -1, 1).reshape(-1)).item()
    assert loss < divergence_loss_ceiling(384) - 1.0, loss


def _run(tiny_shards, run, lr: float, clip: float):
    tc = TrainConfig(max_steps=8, micro_batch_size=2, eval_interval=0, tensorboard=False, report=False,
                     lr=lr, grad_clip=clip, warmup_steps=0, lr_schedule="constant", log_interval=1)
    train(RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32), train=tc), tiny_shards, run,
          progress=False)
    return read_metrics(run)


def test_lr_1_without_clip_gets_a_divergence_event_early_and_a_normal_run_none(tiny_shards, tmp_path):
    rows = _run(tiny_shards, tmp_path / "hot", lr=1.0, clip=0.0)
    events = [e for r in rows for e in r.get("events") or [] if e.get("kind") == "divergence"]
    assert events and events[0]["step"] <= 4 and events[0]["ceiling"] == pytest.approx(divergence_loss_ceiling(384))
    assert len(events) == 1 or events[1]["step"] > events[0]["step"] + 1  # not one per step
    rows = _run(tiny_shards, tmp_path / "calm", lr=1e-3, clip=1.0)
    assert not [e for r in rows for e in r.get("events") or []]


def test_cpu_peak_is_measured_once_and_precision_and_mfu_name_the_same_figure(monkeypatch):
    calls = []

    def fake(dtype=torch.float32, **kw):
        calls.append(dtype)
        return (825.2e9 if dtype == torch.bfloat16 else 300e9) / (1 + len(calls))  # a new figure every call

    monkeypatch.delenv("GPTFORGE_AUTO_PRECISION", raising=False)
    monkeypatch.setattr(device_mod, "_CPU_PEAKS", {})
    monkeypatch.setattr(device_mod, "measure_cpu_matmul_peak", fake)
    said = []
    chosen = resolve_precision("auto", torch.device("cpu"), said.append)
    assert chosen == "bf16" and len(calls) == 2
    peak = device_peak(torch.device("cpu"), chosen)
    assert len(calls) == 2  # reused, not measured again
    assert peak.flops_per_second == cpu_matmul_peak(torch.bfloat16) and len(calls) == 2
    assert f"bf16 {peak.flops_per_second / 1e9:,.1f}" in said[0]
