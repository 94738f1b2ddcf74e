import json

import pytest

from gptforge.config import ModelConfig, ParallelConfig, RunConfig, TrainConfig
from gptforge.train.parallel.deepspeed_config import load_ds_config, translate

DS = {
    "train_batch_size": 32,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 4,
    "gradient_clipping": 0.5,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.98], "eps": 1e-8, "weight_decay": 0.05}},
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
}


def _cfg(**train):
    return RunConfig(model=ModelConfig(), train=TrainConfig(**train), parallel=ParallelConfig(backend="deepspeed"))


def test_file_values_fill_gptforge_defaults():
    cfg, ds = translate(DS, _cfg(), world_size=2)
    t, p = cfg.train, cfg.parallel
    assert (t.micro_batch_size, t.gradient_accumulation_steps, t.grad_clip) == (4, 4, 0.5)
    assert (t.lr, t.beta1, t.beta2, t.weight_decay, t.precision) == (1e-3, 0.9, 0.98, 0.05, "bf16")
    assert (p.zero_stage, p.offload) == (3, "optimizer+params")
    assert ds["train_batch_size"] == 32 and ds["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert ds["fp16"]["enabled"] is False and ds["bf16"]["enabled"] is True


def test_missing_keys_are_filled_from_gptforge():
    cfg, ds = translate({"zero_optimization": {"stage": 1}}, _cfg(micro_batch_size=2, lr=3e-4), world_size=4)
    assert ds["train_micro_batch_size_per_gpu"] == 2 and ds["gradient_accumulation_steps"] == 1
    assert ds["train_batch_size"] == 8
    assert ds["optimizer"] == {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                            "weight_decay": 0.1}}
    assert ds["gradient_clipping"] == 1.0 and cfg.parallel.zero_stage == 1


def test_conflicts_are_errors_naming_both_sides():
    with pytest.raises(ValueError) as e:
        translate(DS, _cfg(lr=5e-4, micro_batch_size=16, precision="fp16"), world_size=2)
    msg = str(e.value)
    assert "optimizer.params.lr = 0.001 but train.lr = 0.0005" in msg
    assert "train_micro_batch_size_per_gpu = 4 but train.micro_batch_size = 16" in msg
    assert "train.precision = 'fp16'" in msg


def test_batch_size_arithmetic_and_refused_keys():
    with pytest.raises(ValueError, match="train_batch_size = 32 but .* x 4 processes = 64"):
        translate(DS, _cfg(), world_size=4)
    with pytest.raises(ValueError, match="scheduler"):
        translate({"scheduler": {"type": "WarmupLR"}}, _cfg(), world_size=1)
    with pytest.raises(ValueError, match="offload_param needs stage 3"):
        translate({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}, _cfg(), world_size=1)
    with pytest.raises(ValueError, match="both true"):
        translate({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, _cfg(), world_size=1)
    with pytest.raises(ValueError, match="needs zero_optimization.stage 1, 2 or 3"):
        translate({"bf16": {"enabled": True}}, _cfg(), world_size=1)
    with pytest.raises(ValueError, match="not supported; use AdamW"):
        translate({"optimizer": {"type": "Lamb"}}, _cfg(), world_size=1)


def test_load_ds_config_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_ds_config(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{oops")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_ds_config(bad)
    good = tmp_path / "ds.json"
    good.write_text(json.dumps(DS))
    assert load_ds_config(good)["train_batch_size"] == 32


def test_deepspeed_run_config_layout(tmp_path):
    from gptforge.train.parallel.deepspeed_config import deepspeed_run_config

    with pytest.raises(ValueError, match="needs parallel.deepspeed_config"):
        deepspeed_run_config(_cfg(), 2)
    f = tmp_path / "ds.json"
    f.write_text(json.dumps({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 4}))
    cfg = RunConfig(model=ModelConfig(), train=TrainConfig(),
                    parallel=ParallelConfig(backend="deepspeed", deepspeed_config=str(f), dp_shard=4))
    with pytest.raises(ValueError, match="every process is a data-parallel rank"):
        deepspeed_run_config(cfg, 2)
    cfg.parallel.dp_shard = 1
    merged, ds, env_pc = deepspeed_run_config(cfg, 2)
    assert merged.parallel.zero_stage == 2 and merged.train.micro_batch_size == 4
    assert ds["train_batch_size"] == 8 and env_pc.dp_replicate == 2 and env_pc.world_size == 2
