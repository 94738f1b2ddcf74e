"""train.max_minutes with train.compile auto: the budget uses the chosen side's step time and counts
the probes' seconds (all measurements mocked: nothing is compiled)."""

import pytest
import yaml

import gptforge.train.budget as budget
import gptforge.train.trainer as trainer_mod
from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.train import compile_choice
from gptforge.train.compile_choice import CompileProbe
from gptforge.train.run import train


def _cfg(**kw):
    tc = TrainConfig(max_minutes=1.0, micro_batch_size=2, eval_interval=0, warmup_steps=2, checkpoint_interval=0,
                     tensorboard=False, report=False, compile="auto", **kw)
    return RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32, dropout=0.0), train=tc)


@pytest.fixture
def mocked(monkeypatch):
    monkeypatch.delenv(compile_choice.AUTO_COMPILE_ENV, raising=False)
    monkeypatch.setattr(compile_choice, "cpp_compiler", lambda: "/usr/bin/c++")
    monkeypatch.setattr(budget, "measure_step_seconds", lambda *a, **k: pytest.fail("the probe's figure is reused"))
    # Build the trainer only: a chosen compile must not compile for real in a test.
    monkeypatch.setattr(trainer_mod.Trainer, "train", lambda self: (self.close(), self)[1])

    def probe(eager_s, compiled_s, total_s):
        monkeypatch.setattr(compile_choice, "measure_compile",
                            lambda *a, **k: CompileProbe(eager_s, compiled_s, warmup_s=total_s - 1, total_s=total_s))
    return probe


@pytest.mark.parametrize("eager_s,compiled_s,expected", [
    (0.369, 0.12, int((60 - 17.6) / 0.12)),   # compile chosen: sized for the compiled step
    (0.05, 0.369, int((60 - 17.6) / 0.05)),   # eager chosen: sized for the eager step
])
def test_budget_uses_chosen_side_and_subtracts_probe_time(tiny_shards, tmp_path, mocked, eager_s, compiled_s,
                                                          expected):
    mocked(eager_s, compiled_s, 17.6)
    said = []
    t = train(_cfg(), tiny_shards, tmp_path / "run", progress=False, log=said.append)
    assert t.tc.compile is (compiled_s < eager_s)
    assert t.tc.max_steps == t.tc.max_minutes_steps == expected
    assert t.budget_spent_s == pytest.approx(17.6)
    line = next(m for m in said if m.startswith("train.max_minutes 1:"))
    assert "17.6 s of start-up probes" in line and "42.4 s left" in line and f"train.max_steps {expected}" in line
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["train"]["max_steps"] == expected


def test_measured_budget_uses_chosen_compile(tiny_shards, tmp_path, monkeypatch):
    """Without a probe (compile given), the step is measured with the run's compile setting: a single
    process compiles the whole model."""
    seen = []
    monkeypatch.setattr(budget, "measure_step_seconds",
                        lambda mc, tc, repeats=3, whole=False: seen.append((tc.compile, whole)) or 0.5)
    monkeypatch.setattr(trainer_mod.Trainer, "train", lambda self: (self.close(), self)[1])
    cfg = _cfg()
    cfg = RunConfig(model=cfg.model, train=TrainConfig(**{**cfg.train.__dict__, "compile": True}))
    t = train(cfg, tiny_shards, tmp_path / "run", progress=False)
    assert seen == [(True, True)] and t.tc.max_steps == int(60 / 0.5)


def test_steps_for_minutes_takes_off_spent_seconds():
    assert budget.steps_for_minutes(1.0, 0.1, eval_share=0.0, spent_seconds=30.0) == 300
    assert budget.steps_for_minutes(1.0, 0.1, eval_share=0.0, spent_seconds=90.0, minimum=5) == 5


def test_every_rank_plans_with_rank0s_step_time(tiny_shards, tmp_path, monkeypatch):
    """Ranks time their own steps; the budget takes rank 0's figures (broadcast through
    DistEnv.rank0_value), so all ranks plan the same max_steps and stop at the same step."""
    from gptforge.train.parallel.distributed import DistEnv

    monkeypatch.setattr(budget, "measure_step_seconds", lambda *a, **k: 0.7)  # this rank's own timing
    monkeypatch.setattr(trainer_mod.Trainer, "train", lambda self: (self.close(), self)[1])
    sent = []

    def rank0(self, value):
        sent.append(value)
        return (0.5, 2.0, "eager, measured") if isinstance(value, tuple) and len(value) == 3 else value

    monkeypatch.setattr(DistEnv, "rank0_value", rank0)
    cfg = _cfg()
    cfg = RunConfig(model=cfg.model, train=TrainConfig(**{**cfg.train.__dict__, "compile": False}))
    t = train(cfg, tiny_shards, tmp_path / "run", progress=False)
    assert any(isinstance(v, tuple) and v[0] == 0.7 for v in sent)  # this rank offered its own figure
    assert t.budget_spent_s == 2.0 and t.tc.max_steps == budget.steps_for_minutes(1.0, 0.5, eval_share=0.0,
                                                                                    spent_seconds=2.0)
