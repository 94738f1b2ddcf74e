"""Step-time probes on a CPU set glibc's allocator policy first (gptforge.runtime.host_memory), as the
CPU run does: a probe without it page-faults every step's buffers and overestimates the run's step."""

from __future__ import annotations

import torch

import gptforge.model.gpt as gpt_module
from gptforge.config import ModelConfig, TrainConfig

TINY = ModelConfig(n_layer=1, n_head=2, d_model=16, block_size=8, vocab_size=32, dropout=0.0)


def _record(monkeypatch, module) -> list[str]:
    """Record, in order, calls of `module.keep_freed_memory` and constructions of GPT."""
    calls: list[str] = []
    # raising=False: a probe module that never looks the function up fails the order assertion instead.
    monkeypatch.setattr(module, "keep_freed_memory", lambda *a, **k: calls.append("keep") or True, raising=False)
    real = gpt_module.GPT

    class Recorded(real):  # type: ignore[misc, valid-type]
        def __init__(self, *a, **k):
            calls.append("model")
            super().__init__(*a, **k)

    monkeypatch.setattr(gpt_module, "GPT", Recorded)
    return calls


def test_budget_probe_keeps_freed_memory_before_building_the_model(monkeypatch):
    from gptforge.train import budget

    calls = _record(monkeypatch, budget)
    tc = TrainConfig(micro_batch_size=2, lr=1e-3, device="cpu", precision="fp32", compile=False)
    assert budget.measure_step_seconds(TINY, tc, repeats=1) > 0
    assert calls == ["keep", "model"]


def test_sweep_probe_keeps_freed_memory_before_building_the_model(monkeypatch):
    from gptforge.train.workflows import sweep

    calls = _record(monkeypatch, sweep)
    tc = TrainConfig(micro_batch_size=2, lr=1e-3, device="cpu")
    assert sweep.measure_step_seconds(TINY, tc, torch.device("cpu"), steps=1) > 0
    assert calls == ["keep", "model"]


def test_compile_probe_keeps_freed_memory_before_building_the_model(monkeypatch):
    import gptforge.train.parallel.parallelize as parallelize
    from gptforge.train import compile_choice

    calls = _record(monkeypatch, compile_choice)
    monkeypatch.setattr(parallelize, "apply_compile", lambda model, whole=True: None)  # eager both sides: fast
    tc = TrainConfig(micro_batch_size=2, lr=1e-3, device="cpu")
    probe = compile_choice.measure_compile(TINY, tc, "fp32", torch.device("cpu"), steps=1)
    assert probe.eager_s > 0 and probe.compiled_s > 0
    assert calls == ["keep", "model"]
