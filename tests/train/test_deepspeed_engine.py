"""The DeepSpeed backend trains through DeepSpeed's engine and gives the single-process losses.

gloo on the CPU, 2 processes started once (see dist_harness.py), a 2-layer d_model-32 fp32 model,
5 steps: ZeRO-1, ZeRO-2 and ZeRO-3 with CPU offload each match the single-process torch run to
1e-5 relative; a ZeRO-2 checkpoint at step 3 resumes with the same losses; the checkpoint's DCP
weights equal the reference run's. Skipped when DeepSpeed is not importable.

The very first DeepSpeed run on a machine compiles two small C++ extensions with the system
compiler and ninja (`deepspeed_shm_comm` at DeepSpeed's communication start-up and `fused_adam`,
or `cpu_adam` under offload_optimizer); torch caches them in ~/.cache/torch_extensions
(TORCH_EXTENSIONS_DIR), so only that first run takes minutes.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.runtime import checkpoint as ck
from gptforge.runtime.loading import load_for_inference
from gptforge.train.parallel.backend import deepspeed_available
from gptforge.train.run import train
from tests.train.dist_harness import run_layouts

pytestmark = pytest.mark.skipif(not deepspeed_available(), reason="DeepSpeed is not importable "
                                "(pip install gptforge[deepspeed])")

REL = 1e-5
TIED = dict(arch="gpt2", n_layer=2, n_head=2, d_model=32, block_size=32, dropout=0.0)
BASE = dict(max_steps=5, lr=3e-3, warmup_steps=2, eval_interval=5, eval_steps=2, checkpoint_interval=0,
            tensorboard=False, seed=7, grad_clip=0.5)
# Global batch 8 sequences everywhere: 1 process x 2 x 4, or 2 ranks x 2 x 2.
REF_TRAIN = dict(BASE, micro_batch_size=2, gradient_accumulation_steps=4)
DS_TRAIN = dict(BASE, micro_batch_size=2, gradient_accumulation_steps=2)

DS_CONFIGS = {
    # Keys shared with gptforge's config agree with it (translate() would refuse otherwise).
    "zero1": {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
              "gradient_clipping": 0.5, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
              "zero_optimization": {"stage": 1}},
    "zero2": {"zero_optimization": {"stage": 2}},
    "zero3_offload": {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                            "offload_param": {"device": "cpu"}}},
}


def _assert_close(got: list[float], want: list[float], what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} steps, expected {len(want)}"
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert abs(a - b) <= REL * abs(b), f"{what}: step {i + 1} loss {a!r} vs single-process {b!r}"


@pytest.fixture(scope="module")
def ds_runs(tiny_shards, tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("deepspeed")
    ref = train(RunConfig(model=ModelConfig(**TIED), train=TrainConfig(**REF_TRAIN)), tiny_shards, root / "ref",
                progress=False)
    files = {}
    for name, doc in DS_CONFIGS.items():
        files[name] = root / f"{name}.json"
        files[name].write_text(json.dumps(doc))

    def job(name, cfg_name, run, resume=False, **train_kw):
        return dict(name=name, model=TIED, train=dict(DS_TRAIN, **train_kw),
                    parallel=dict(backend="deepspeed", deepspeed_config=str(files[cfg_name])),
                    data=str(tiny_shards), run_dir=str(root / run), resume=resume)

    jobs = [job(n, n, n) for n in DS_CONFIGS]
    jobs += [job("zero2_save", "zero2", "zero2_ckpt", stop_at_step=3),
             job("zero2_resume", "zero2", "zero2_ckpt", resume=True)]
    runs = run_layouts(2, jobs, root / "out", timeout_s=900)
    return {"ref": ref, "runs": runs, "root": root}


def _run(ds_runs, name):
    r = ds_runs["runs"][name]
    assert "error" not in r, f"{name} failed:\n{r['error']}"
    return r


@pytest.mark.parametrize("name", list(DS_CONFIGS))
def test_deepspeed_zero_matches_single_process(ds_runs, name):
    r = _run(ds_runs, name)
    ref = ds_runs["ref"]
    _assert_close(r["loss"], [h["loss"] for h in ref.history], name)
    _assert_close([r["val_loss"][-1]], [ref.val_loss], f"{name} val")
    # DeepSpeed's own norm (before its clipping) is the global one.
    for got, want in zip([row["grad_norm"] for row in r["rows"]], [h["grad_norm"] for h in ref.history], strict=True):
        assert abs(got - want) <= 1e-4 * want
    cfg = (ds_runs["root"] / name / "config.yaml").read_text()
    assert "backend: deepspeed" in cfg and "world_size: 2" in cfg


def test_deepspeed_checkpoint_resumes_with_same_losses(ds_runs):
    want = [h["loss"] for h in ds_runs["ref"].history]
    _assert_close(_run(ds_runs, "zero2_save")["loss"], want[:3], "ZeRO-2 up to the checkpoint")
    _assert_close(_run(ds_runs, "zero2_resume")["loss"], want[3:], "ZeRO-2 resumed at step 3")
    step = ck.find_checkpoint(ds_runs["root"] / "zero2_ckpt")
    assert step.name == "step_0000005"
    assert sorted(p.name for p in (step / "deepspeed").iterdir()) == [
        "mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt"]


@pytest.mark.parametrize("name", ["zero1", "zero3_offload"])
def test_deepspeed_checkpoint_weights_are_readable_dcp(ds_runs, name):
    """The fp32 weights beside DeepSpeed's state load like any checkpoint's (evaluate, export); atol
    1e-5 is 300x below one step's update (lr 3e-3): Adam magnifies ulp-level gradient differences of
    near-zero gradients, so bitwise-equal weights are not expected."""
    _run(ds_runs, name)
    got, _, doc, _ = load_for_inference(ds_runs["root"] / name)
    want, _, _, _ = load_for_inference(ds_runs["root"] / "ref")
    assert doc["parallel"]["zero_stage"] == (1 if name == "zero1" else 3)
    want_sd = want.state_dict()
    for k, v in got.state_dict().items():
        torch.testing.assert_close(v, want_sd[k], rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"{name} {k}: {m}")


def test_torch_backend_refuses_a_deepspeed_checkpoint(ds_runs, tiny_shards):
    run = ds_runs["root"] / "zero1_copy"
    shutil.copytree(ds_runs["root"] / "zero1", run)
    cfg = RunConfig(model=ModelConfig(**TIED), train=TrainConfig(**dict(REF_TRAIN, max_steps=6)))
    with pytest.raises(ValueError, match="written by the DeepSpeed backend"):
        train(cfg, tiny_shards, run, resume=True, progress=False)
