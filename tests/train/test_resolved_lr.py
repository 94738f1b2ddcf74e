"""Resolve once (issue 22): a run with no --train.lr uses config.yaml's learning rate everywhere.

Every backend (a single process, DDP and FSDP2 on 2 gloo ranks, the DeepSpeed config translation)
trains without train.lr; config.yaml records the size-aware lr of model.d_model, and the optimizer
as built, the schedule's lr of every step and the DeepSpeed JSON all take that value.
"""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch
import yaml

import gptforge.train.trainer as trainer_mod
from gptforge.config import ModelConfig, ParallelConfig, RunConfig, TrainConfig, from_dict
from gptforge.train.loggers import read_metrics
from gptforge.train.optim import default_lr, default_warmup, lr_at, param_groups
from gptforge.train.parallel.backend import TorchBackend
from gptforge.train.parallel.distributed import DistEnv
from gptforge.train.parallel.parallelize import Parallelized
from gptforge.train.resolve import Probes, ResolvedRun, resolve_run
from tests.train.dist_harness import run_layouts

MODEL = dict(arch="gpt2", n_layer=2, n_head=2, d_model=32, block_size=32, dropout=0.0)
# No lr, min_lr or warmup_steps: the size-aware defaults decide them.
TRAIN = dict(max_steps=4, micro_batch_size=2, eval_interval=0, checkpoint_interval=0, tensorboard=False,
             report=False, seed=5)
SIZE_AWARE_LR = default_lr(32, 4)  # 0.0037


def _saved_train(run_dir) -> TrainConfig:
    doc = yaml.safe_load((run_dir / "config.yaml").read_text())
    return from_dict(TrainConfig, doc["train"], "train.")


def _check_schedule(rows: list[dict], tc: TrainConfig) -> None:
    """The lr of every logged step is the schedule of config.yaml's train section."""
    assert [r["step"] for r in rows] == list(range(1, tc.max_steps + 1))
    assert [r["lr"] for r in rows] == pytest.approx([lr_at(i, tc) for i in range(tc.max_steps)], rel=1e-12)


def _check_saved(tc: TrainConfig) -> None:
    assert tc.lr == SIZE_AWARE_LR and tc.min_lr == pytest.approx(SIZE_AWARE_LR / 10)
    assert tc.warmup_steps == default_warmup(4) and tc.compile is False and tc.precision == "fp32"


def test_plain_run_uses_config_yaml_lr(tiny_shards, tmp_path, monkeypatch):
    built = []
    real = trainer_mod.build_optimizer

    def spy(model, cfg, device_type, zero_group=None):
        opt = real(model, cfg, device_type, zero_group=zero_group)
        built.append(opt.param_groups[0]["lr"])  # as built, before the schedule sets any step's lr
        return opt

    monkeypatch.setattr(trainer_mod, "build_optimizer", spy)
    from gptforge.train.run import train

    cfg = RunConfig(model=ModelConfig(**MODEL), train=TrainConfig(**TRAIN))
    assert cfg.train.lr is None
    train(cfg, tiny_shards, tmp_path / "run", progress=False)
    tc = _saved_train(tmp_path / "run")
    _check_saved(tc)
    assert built == [tc.lr]
    _check_schedule(read_metrics(tmp_path / "run"), tc)


def test_ddp_and_fsdp2_on_two_gloo_ranks_use_config_yaml_lr(tiny_shards, tmp_path):
    jobs = [{"name": name, "model": MODEL, "train": TRAIN, "parallel": parallel, "data": str(tiny_shards),
             "run_dir": str(tmp_path / name)}
            for name, parallel in (("ddp", {"dp_replicate": 2, "dp_shard": 1}), ("fsdp2", {"dp_shard": 2}))]
    results = run_layouts(2, jobs, tmp_path / "out")
    for name in ("ddp", "fsdp2"):
        assert "error" not in results[name], results[name].get("error")
        tc = _saved_train(tmp_path / name)
        _check_saved(tc)
        assert tc.global_batch_size == 4  # 2 sequences x 2 data-parallel ranks
        _check_schedule(results[name]["rows"], tc)


class _JsonEngine(TorchBackend):
    """Stands in for DeepSpeed's engine (not needed installed): like `deepspeed.initialize`, it
    builds its AdamW from the JSON's optimizer.params, and records the JSON it was given."""

    seen: list[dict] = []

    def __init__(self, model, ds_config: dict, weight_decay: float, env):
        _JsonEngine.seen.append(ds_config)
        p = ds_config["optimizer"]["params"]
        opt = torch.optim.AdamW(param_groups(model, weight_decay), lr=p["lr"], betas=tuple(p["betas"]), eps=p["eps"])
        self.built_lr = opt.param_groups[0]["lr"]
        self.core, self.zero_stage = model, 0
        super().__init__(Parallelized(module=model, core=model), opt, None, env, "fp32")


def test_deepspeed_json_takes_config_yaml_lr(tiny_shards, tmp_path, monkeypatch):
    from gptforge.train.parallel.deepspeed_config import translate
    from gptforge.train.sources import ShardSource

    cfg = RunConfig(model=ModelConfig(**MODEL), train=TrainConfig(**TRAIN), parallel=ParallelConfig(backend="deepspeed"))
    merged, ds = translate({"zero_optimization": {"stage": 1}}, cfg, world_size=1)
    assert "lr" not in ds["optimizer"]["params"]  # unresolved: no learning rate is made up here
    monkeypatch.setattr(trainer_mod, "DeepSpeedBackend", _JsonEngine)
    _JsonEngine.seen.clear()
    source = ShardSource(tiny_shards, eval_steps=1, micro_batch_size=2)
    t = trainer_mod.Trainer(merged, DistEnv(), source, tmp_path / "run", progress=False, ds_config=ds)
    t.train()
    tc = _saved_train(tmp_path / "run")
    _check_saved(tc)
    (json_cfg,) = _JsonEngine.seen
    assert json_cfg["optimizer"]["params"]["lr"] == tc.lr == t.engine.built_lr
    assert json_cfg["train_batch_size"] == tc.global_batch_size == 2
    _check_schedule(read_metrics(tmp_path / "run"), tc)


def test_resolve_run_leaves_no_training_field_unset():
    cfg = RunConfig(model=ModelConfig(**MODEL), train=TrainConfig(**{**TRAIN, "max_minutes": 1.0, "eval_interval": 5}))
    data = types.SimpleNamespace(vocab_size=384, description="test data", source_tokens=None)
    said = []
    run = resolve_run(cfg, DistEnv(), data, Probes(precision="fp32", compile=False, step_seconds=0.5,
                                                   step_how="eager, measured", spent_seconds=10.0), log=said.append)
    tc = run.train
    # 60 s - 10 s of probes, 10% for evaluation, 0.5 s/step: 90 steps; warmup 5% of those (at least 10).
    assert (tc.max_steps, tc.max_minutes_steps, tc.warmup_steps) == (90, 90, default_warmup(90))
    assert (tc.lr, tc.min_lr, tc.muon_lr, tc.global_batch_size) == (SIZE_AWARE_LR, pytest.approx(SIZE_AWARE_LR / 10),
                                                                     0.02, 2)
    assert run.model.vocab_size == 384 and run.budget_spent_s == 10.0 and run.layout["dp"] == 1
    assert any(s.startswith("size-aware defaults: lr 0.0037") for s in said)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.train = cfg.train
    with pytest.raises(ValueError, match="unresolved fields \\['lr'"):
        ResolvedRun(model=run.model, train=dataclasses.replace(tc, lr=None), parallel=run.parallel,
                    requested_parallel=run.parallel, layout=run.layout)
    # A resume keeps the checkpoint's values for fields unset now, whatever the rule says.
    resumed = resolve_run(cfg, DistEnv(), data, Probes(precision="fp32", compile=True,
                                                       saved_train={"lr": 0.004, "warmup_steps": 3}))
    assert (resumed.train.lr, resumed.train.warmup_steps, resumed.train.compile) == (0.004, 3, True)


def test_document_mask_is_resolved_once():
    cfg = RunConfig(model=ModelConfig(**MODEL), train=TrainConfig(**TRAIN))
    assert cfg.train.document_mask is None  # unset in the user's config
    data = types.SimpleNamespace(vocab_size=384, description="test data", source_tokens=None)
    probes = Probes(precision="fp32", compile=False)
    assert resolve_run(cfg, DistEnv(), data, probes).train.document_mask is False
    # On resume the run's own value wins over the default; an explicit value wins over both.
    resumed = resolve_run(cfg, DistEnv(), data, dataclasses.replace(probes, saved_train={"document_mask": True}))
    assert resumed.train.document_mask is True
    asked = RunConfig(model=cfg.model, train=dataclasses.replace(cfg.train, document_mask=False))
    assert resolve_run(asked, DistEnv(), data, dataclasses.replace(probes, saved_train={"document_mask": True})) \
        .train.document_mask is False
    run = resolve_run(cfg, DistEnv(), data, probes)
    with pytest.raises(ValueError, match="document_mask None"):
        ResolvedRun(model=run.model, train=dataclasses.replace(run.train, document_mask=None), parallel=run.parallel,
                    requested_parallel=run.parallel, layout=run.layout)
