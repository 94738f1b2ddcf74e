"""train.compile auto: the faster of compiled and eager on a CPU, frozen in config.yaml; compiled
training gives eager's losses."""

import pytest
import torch
import yaml

from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.train import compile_choice
from gptforge.train.compile_choice import CompileProbe, resolve_compile
from gptforge.train.loggers import read_metrics
from gptforge.train.run import train

CPU = torch.device("cpu")
HAS_CXX = compile_choice.cpp_compiler() is not None
MC = ModelConfig(preset="gpt2-nano", block_size=32, vocab_size=384)


def _probe(eager_s, compiled_s):
    def measure(model_cfg, train_cfg, precision, device, whole=False):
        # A single process compiles the whole model, and the probe measures what the run will use.
        assert precision == "fp32" and device == CPU and whole is True
        return CompileProbe(eager_s=eager_s, compiled_s=compiled_s, warmup_s=1.0, total_s=2.0)
    return measure


@pytest.fixture
def with_compiler(monkeypatch):
    monkeypatch.delenv(compile_choice.AUTO_COMPILE_ENV, raising=False)
    monkeypatch.setattr(compile_choice, "cpp_compiler", lambda: "/usr/bin/c++")


def test_auto_picks_the_faster_measured_side(with_compiler):
    said = []
    tc = TrainConfig(compile="auto")
    assert resolve_compile("auto", MC, tc, "fp32", CPU, said.append, measure=_probe(0.20, 0.10)) is True
    assert "auto -> true" in said[-1] and "100 ms compiled (whole model) vs 200 ms eager" in said[-1]
    assert resolve_compile("auto", MC, tc, "fp32", CPU, said.append, measure=_probe(0.10, 0.20)) is False
    # Within MIN_GAIN of eager: eager is kept.
    assert resolve_compile("auto", MC, tc, "fp32", CPU, said.append, measure=_probe(0.100, 0.098)) is False
    # Ranks agree on summed figures: here another rank's sum makes compiled the faster.
    assert resolve_compile("auto", MC, tc, "fp32", CPU, measure=_probe(0.10, 0.20),
                           agree=lambda v: [v[0] + 0.5, v[1] + 0.1]) is True
    # Explicit values are kept, and never measured.
    assert resolve_compile(True, MC, tc, "fp32", CPU, measure=None) is True
    assert resolve_compile(False, MC, tc, "fp32", CPU, measure=None) is False
    with pytest.raises(ValueError, match="true, false or auto"):
        resolve_compile("sometimes", MC, tc, "fp32", CPU)


def test_auto_without_compiler_and_on_cuda(monkeypatch):
    monkeypatch.delenv(compile_choice.AUTO_COMPILE_ENV, raising=False)
    monkeypatch.setattr(compile_choice, "cpp_compiler", lambda: None)
    said = []
    assert resolve_compile("auto", MC, TrainConfig(), "fp32", CPU, said.append, measure=_probe(1.0, 0.1)) is False
    assert "no C++ compiler" in said[0]
    assert resolve_compile("auto", MC, TrainConfig(), "bf16", torch.device("cuda"), measure=_probe(0.1, 1.0)) is True
    monkeypatch.setenv(compile_choice.AUTO_COMPILE_ENV, "true")
    assert resolve_compile("auto", MC, TrainConfig(), "fp32", CPU) is True


def _cfg(compile, **kw):
    tc = TrainConfig(max_steps=6, micro_batch_size=4, lr=3e-3, warmup_steps=2, eval_interval=0,
                     checkpoint_interval=0, tensorboard=False, report=False, seed=3, compile=compile, **kw)
    return RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32, dropout=0.0), train=tc)


def test_auto_choice_is_frozen_in_config_yaml_and_kept_on_resume(tiny_shards, tmp_path, with_compiler, monkeypatch):
    monkeypatch.setattr(compile_choice, "measure_compile", _probe(0.10, 0.30))
    said = []
    train(_cfg("auto", stop_at_step=3), tiny_shards, tmp_path / "run", progress=False, log=said.append)
    assert any("train.compile auto -> false" in s for s in said)
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["train"]["compile"] is False

    # A resume given `auto` again keeps the frozen choice: it never measures.
    def fail(*a):
        raise AssertionError("resume measured again")
    monkeypatch.setattr(compile_choice, "measure_compile", fail)
    res = train(_cfg("auto"), tiny_shards, tmp_path / "run", resume=True, progress=False)
    assert res.step == 6
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["train"]["compile"] is False


@pytest.mark.skipif(not HAS_CXX, reason="no C++ compiler for Inductor's CPU backend")
def test_compiled_training_matches_eager(tiny_shards, tmp_path, monkeypatch):
    monkeypatch.delenv(compile_choice.AUTO_COMPILE_ENV, raising=False)
    # The real probe on the run's own shape (its compilation is cached for the run below).
    cfg = _cfg("auto")
    mc = ModelConfig(preset="gpt2-nano", block_size=32, dropout=0.0, vocab_size=384)  # tiny_shards' vocabulary
    probe = compile_choice.measure_compile(mc, cfg.train, "fp32", CPU, steps=1)
    assert probe.eager_s > 0 and probe.compiled_s > 0 and probe.total_s > probe.warmup_s > 0
    eager = train(_cfg(False), tiny_shards, tmp_path / "eager", progress=False)
    monkeypatch.setattr(compile_choice, "measure_compile", _probe(0.30, 0.10))
    compiled = train(_cfg("auto"), tiny_shards, tmp_path / "compiled", progress=False)
    assert yaml.safe_load((tmp_path / "compiled" / "config.yaml").read_text())["train"]["compile"] is True
    a = [r["loss"] for r in read_metrics(tmp_path / "eager")]
    b = [r["loss"] for r in read_metrics(tmp_path / "compiled")]
    assert len(a) == len(b) == 6 and eager.step == compiled.step == 6
    # Fused kernels may round differently from eager's: the losses agree closely, not bit for bit.
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 2e-3
    assert b[-1] < b[0]


@pytest.mark.skipif(not HAS_CXX, reason="no C++ compiler for Inductor's CPU backend")
def test_single_process_compiles_the_whole_model_and_samples_decode_eagerly(tiny_shards, tmp_path, monkeypatch):
    """`train.compile true` without a layout: one graph for the whole model (the blocks stay plain
    modules, the names stay), and the end-of-run samples decode eagerly (no compile per length)."""
    import json

    import gptforge.train.trainer as trainer_mod
    from gptforge.model.gpt import Block

    laid_out = []
    real = trainer_mod.parallelize
    monkeypatch.setattr(trainer_mod, "parallelize", lambda *a, **k: laid_out.append(real(*a, **k)) or laid_out[-1])
    cfg = _cfg(True)
    cfg = RunConfig(model=cfg.model, train=TrainConfig(**{**cfg.train.__dict__, "report": True, "max_steps": 3}))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # reset() keeps the counts of earlier tests in this process
    train(cfg, tiny_shards, tmp_path / "run", progress=False)
    core = laid_out[0].core
    assert all(type(b) is Block for b in core.blocks)  # not per-block OptimizedModules
    assert core._compiled_call_impl is not None  # nn.Module.compile: the whole forward is compiled
    assert not any("_orig_mod" in k for k in core.state_dict())
    doc = json.loads((tmp_path / "run" / "samples.json").read_text())
    assert doc["step"] == 3 and len(doc["samples"]) == 8
    # Training compiled one graph; 8 decodes of up to 32 tokens would have added many more.
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert 0 < frames <= 3
