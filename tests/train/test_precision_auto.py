"""precision=auto: bf16 only where this machine runs it faster than fp32 (a slow bf16 asked for
explicitly warns with both figures), and the choice is frozen in config.yaml."""

from __future__ import annotations

import pytest
import torch
import yaml

import gptforge.runtime.device as device_mod
from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.runtime.device import resolve_precision
from gptforge.train.run import train


def _fake_peaks(monkeypatch, fp32: float, bf16: float):
    monkeypatch.delenv("GPTFORGE_AUTO_PRECISION", raising=False)
    monkeypatch.setattr(device_mod, "_CPU_PEAKS", {})  # forget figures measured (or faked) before
    monkeypatch.setattr(device_mod, "measure_cpu_matmul_peak",
                        lambda dtype=torch.float32, **kw: bf16 if dtype == torch.bfloat16 else fp32)


def test_precision_auto_picks_fp32_where_bf16_is_slower(monkeypatch):
    _fake_peaks(monkeypatch, fp32=17.6e9, bf16=1.2e9)  # the AVX2-only EPYC of the issue
    said = []
    assert resolve_precision("auto", torch.device("cpu"), said.append) == "fp32"
    assert "bf16 1.2 vs fp32 17.6 GFLOP/s" in said[0]
    _fake_peaks(monkeypatch, fp32=17.6e9, bf16=60e9)  # a CPU with AVX-512 BF16 / AMX
    assert resolve_precision("auto", torch.device("cpu")) == "bf16"


def test_explicit_bf16_on_a_slow_bf16_cpu_warns_with_both_figures(monkeypatch):
    _fake_peaks(monkeypatch, fp32=17.6e9, bf16=1.2e9)
    said = []
    assert resolve_precision("bf16", torch.device("cpu"), said.append) == "bf16"
    assert said and "WARNING" in said[0] and "1.2 GFLOP/s" in said[0] and "17.6" in said[0]


def test_auto_is_frozen_in_config_yaml(tiny_shards, tmp_path, monkeypatch):
    _fake_peaks(monkeypatch, fp32=17.6e9, bf16=1.2e9)
    run = tmp_path / "run"
    train(RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32),
                    train=TrainConfig(max_steps=2, micro_batch_size=2, eval_interval=0, tensorboard=False,
                                      report=False)), tiny_shards, run, progress=False)
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["precision"] == "fp32"



def test_unknown_preset_is_refused_before_the_precision_probe(tiny_shards, tmp_path, monkeypatch):
    measured = []
    monkeypatch.delenv("GPTFORGE_AUTO_PRECISION", raising=False)
    monkeypatch.setattr(device_mod, "_CPU_PEAKS", {})
    monkeypatch.setattr(device_mod, "measure_cpu_matmul_peak", lambda dtype=torch.float32, **kw: measured.append(dtype) or 1e9)
    with pytest.raises(ValueError, match="unknown preset 'gpt9'"):
        train(RunConfig(model=ModelConfig(preset="gpt9"), train=TrainConfig(max_steps=2, precision="auto")),
              tiny_shards, tmp_path / "run", progress=False)
    assert measured == []  # no matmul timed for a run that cannot start
