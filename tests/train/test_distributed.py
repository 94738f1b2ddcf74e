"""Every layout gives the single-process losses: DDP, FSDP2, ZeRO-1/2, TP, PP, 2-D; checkpoints
resume across layouts and process counts.

gloo on the CPU, a 2-layer d_model-32 model in fp32, fixed seed, 5 steps. Workers are started
once per world size and run all their layouts in turn (see dist_harness.py).
"""

from __future__ import annotations

import shutil

import pytest
import torch

from gptforge.config import ModelConfig, ParallelConfig, RunConfig, TrainConfig
from gptforge.runtime import checkpoint as ck
from gptforge.train.loggers import read_metrics
from gptforge.train.parallel import distributed as D
from gptforge.train.run import train
from tests.train.dist_harness import run_layouts

REL = 1e-5
TIED = dict(arch="gpt2", n_layer=2, n_head=2, d_model=32, block_size=32, dropout=0.0)
UNTIED = dict(TIED, tie_embeddings=False)
ZERO1_X4 = dict(dp_shard=4, zero_stage=1)
LLAMA4 = dict(arch="llama", n_layer=4, n_head=2, n_kv_head=2, d_model=32, block_size=32, dropout=0.0)


def _train_kw(mbs: int, gas: int, **kw) -> dict:
    d = dict(max_steps=5, micro_batch_size=mbs, gradient_accumulation_steps=gas, lr=3e-3, warmup_steps=2,
             eval_interval=5, eval_steps=2, checkpoint_interval=0, tensorboard=False, seed=7, grad_clip=0.5)
    d.update(kw)
    return d


# name -> (model, train, parallel, reference). Every layout has a global batch of 8 sequences.
# A reference is a single-process run with the same micro_batch_size (the val windows depend on it).
LAYOUTS_2 = {
    "ddp": (TIED, _train_kw(4, 1), dict(dp_replicate=2), "tied_mb4"),
    "ddp_accum": (TIED, _train_kw(2, 2), dict(dp_replicate=2), "tied_mb2"),
    "fsdp": (TIED, _train_kw(4, 1), dict(dp_shard=2), "tied_mb4"),
    "zero1": (TIED, _train_kw(2, 2), dict(dp_shard=2, zero_stage=1), "tied_mb2"),
    "zero2": (TIED, _train_kw(2, 2), dict(dp_shard=2, zero_stage=2), "tied_mb2"),
    "tp": (TIED, _train_kw(4, 2), dict(tp=2), "tied_mb4"),
    "pp_1f1b": (UNTIED, _train_kw(2, 4), dict(pp=2, pp_schedule="1f1b", pp_microbatches=4), "untied_mb2"),
    "pp_gpipe": (UNTIED, _train_kw(2, 4), dict(pp=2, pp_schedule="gpipe", pp_microbatches=4), "untied_mb2"),
    "pp_interleaved": (LLAMA4, _train_kw(2, 4), dict(pp=2, pp_schedule="interleaved_1f1b", pp_microbatches=4),
                       "llama4_mb2"),
}
LAYOUTS_4 = {
    "fsdp2_x_tp2": (TIED, _train_kw(2, 2), dict(dp_shard=2, tp=2), "tied_mb2"),
    "pp2_x_fsdp2": (UNTIED, _train_kw(2, 2), dict(pp=2, dp_shard=2, pp_microbatches=2), "untied_mb2"),
    # 4 ZeRO-1 shards: some ranks' local optimizers hold an empty parameter group (issue 15, item 12).
    "zero1_x4": (TIED, _train_kw(2, 1), dict(dp_shard=4, zero_stage=1), "tied_mb2"),
}
REFERENCES = {
    "tied_mb4": (TIED, _train_kw(4, 2)),
    "tied_mb2": (TIED, _train_kw(2, 4)),
    "untied_mb2": (UNTIED, _train_kw(2, 4)),
    "llama4_mb2": (LLAMA4, _train_kw(2, 4)),
}


def _cfg(model: dict, train_kw: dict, parallel: dict | None = None) -> RunConfig:
    return RunConfig(model=ModelConfig(**model), train=TrainConfig(**train_kw),
                     parallel=ParallelConfig(**(parallel or {})))


def _job(name, model, train_kw, parallel, data, run_dir, resume=False) -> dict:
    return dict(name=name, model=model, train=train_kw, parallel=parallel, data=str(data), run_dir=str(run_dir),
                resume=resume)


def _assert_close(got: list[float], want: list[float], what: str, rel: float = REL) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} steps, expected {len(want)}"
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert abs(a - b) <= rel * abs(b), f"{what}: step {i + 1} loss {a!r} vs reference {b!r}"


@pytest.fixture(scope="module")
def dist_runs(tiny_shards, tmp_path_factory):
    """Single-process references, then the 2- and 4-process layouts, checkpoints included."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("dist")
    refs = {}
    for name, (model, tkw) in REFERENCES.items():
        res = train(_cfg(model, tkw), tiny_shards, root / f"ref_{name}", progress=False)
        refs[name] = {"loss": [r["loss"] for r in res.history], "val_loss": res.history[-1]["val_loss"]}
    # A single-process checkpoint at step 3, to be resumed by 2 FSDP2 ranks.
    train(_cfg(TIED, _train_kw(4, 2, stop_at_step=3)), tiny_shards, root / "single_to_fsdp", progress=False)

    jobs2 = [_job(n, m, t, p, tiny_shards, root / n) for n, (m, t, p, _) in LAYOUTS_2.items()]
    jobs2 += [
        _job("fsdp_save", TIED, _train_kw(4, 1, stop_at_step=3), dict(dp_shard=2), tiny_shards, root / "fsdp_save"),
        _job("pp_save", UNTIED, _train_kw(2, 4, stop_at_step=3), dict(pp=2, pp_microbatches=4), tiny_shards,
             root / "pp_save"),
        _job("zero1_save", TIED, _train_kw(2, 2, stop_at_step=3), dict(dp_shard=2, zero_stage=1), tiny_shards,
             root / "zero1_save"),
        _job("single_to_fsdp", TIED, _train_kw(4, 1), dict(dp_shard=2), tiny_shards, root / "single_to_fsdp",
             resume=True),
    ]
    # ZeRO-1 on 4 ranks stopped at step 3 (kept aside as zero1_x4_saved), then resumed on 4; the
    # copy is resumed on 2 ranks below.
    jobs4 = [_job(n, m, t, p, tiny_shards, root / n) for n, (m, t, p, _) in LAYOUTS_4.items()]
    jobs4 += [
        dict(_job("zero1_x4_save", TIED, _train_kw(2, 1, stop_at_step=3), ZERO1_X4, tiny_shards,
                  root / "zero1_x4_run"), copy_to=str(root / "zero1_x4_saved")),
        _job("zero1_x4_resume", TIED, _train_kw(2, 1), ZERO1_X4, tiny_shards, root / "zero1_x4_run", resume=True),
    ]
    res4 = run_layouts(4, jobs4, root / "out4")
    shutil.copytree(root / "zero1_x4_saved", root / "zero1_4_to_2")
    # precision auto measured per rank could differ between ranks: pin it differently on each.
    jobs2.append(dict(_job("ddp_auto_precision", TIED, _train_kw(4, 1, precision="auto"), dict(dp_replicate=2),
                           tiny_shards, root / "ddp_auto_precision"),
                      env_per_rank={"0": {"GPTFORGE_AUTO_PRECISION": "fp32"}, "1": {"GPTFORGE_AUTO_PRECISION": "bf16"}}))
    jobs2.append(_job("zero1_4_to_2", TIED, _train_kw(2, 2), dict(dp_shard=2, zero_stage=1), tiny_shards,
                      root / "zero1_4_to_2", resume=True))
    res2 = run_layouts(2, jobs2, root / "out2")
    return {"refs": refs, "runs": {**res2, **res4}, "root": root}


def _run(dist_runs, name):
    r = dist_runs["runs"][name]
    assert "error" not in r, f"{name} failed:\n{r['error']}"
    return r


@pytest.mark.parametrize("name", list(LAYOUTS_2) + list(LAYOUTS_4))
def test_layout_matches_single_process(dist_runs, name):
    layout = {**LAYOUTS_2, **LAYOUTS_4}[name]
    ref = dist_runs["refs"][layout[3]]
    r = _run(dist_runs, name)
    _assert_close(r["loss"], ref["loss"], name)
    _assert_close([r["val_loss"][-1]], [ref["val_loss"]], f"{name} val")


def test_rank0_writes_metrics_with_per_rank_stats(dist_runs):
    rows = read_metrics(dist_runs["root"] / "ddp")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]  # one writer, no duplicate rows
    for r in rows:
        assert 0 < r["tokens_per_second_rank_min"] <= r["tokens_per_second_rank_max"]
    cfg = (dist_runs["root"] / "fsdp" / "config.yaml").read_text()
    assert "zero_stage: 3" in cfg and "world_size: 2" in cfg


@pytest.mark.parametrize("saved,model,tkw", [
    ("fsdp_save", TIED, _train_kw(4, 2)),       # FSDP2, 2 ranks -> 1 process
    ("pp_save", UNTIED, _train_kw(2, 4)),       # 2 pipeline stages -> 1 process
    ("zero1_save", TIED, _train_kw(8, 1)),      # ZeRO-1 optimizer shards -> 1 process
])
def test_checkpoint_resumes_on_one_process(dist_runs, saved, model, tkw):
    r = _run(dist_runs, saved)
    ref = dist_runs["refs"]["untied_mb2" if model is UNTIED else "tied_mb4"]["loss"]
    _assert_close(r["loss"], ref[:3], saved)
    run = dist_runs["root"] / saved
    assert ck.find_checkpoint(run).name == "step_0000003"
    resumed = dist_runs["root"] / f"{saved}_resumed"
    shutil.copytree(run, resumed)
    res = train(_cfg(model, tkw), _data_of(run), resumed, resume=True, progress=False)
    _assert_close([h["loss"] for h in res.history], ref[3:], f"{saved} resumed on 1 process")


def _data_of(run):
    import yaml

    return yaml.safe_load((run / "config.yaml").read_text())["data"]["path"]


def test_single_process_checkpoint_resumes_on_two_fsdp_ranks(dist_runs):
    r = _run(dist_runs, "single_to_fsdp")
    ref = dist_runs["refs"]["tied_mb4"]["loss"]
    _assert_close(r["loss"], ref[3:], "1 process -> FSDP2 x 2")


def test_resume_with_another_global_batch_is_an_error(dist_runs, tiny_shards):
    run = dist_runs["root"] / "fsdp_save"
    other = dist_runs["root"] / "fsdp_save_gbs"
    shutil.copytree(run, other)
    with pytest.raises(ValueError, match="global batch of 8"):
        train(_cfg(TIED, _train_kw(4, 1)), tiny_shards, other, resume=True, progress=False)


def test_layout_errors_are_clear():
    with pytest.raises(ValueError, match="= 2 processes, but this job has 1"):
        ParallelConfig(dp_shard=2).validate(1)
    with pytest.raises(ValueError, match="zero_stage=1"):
        ParallelConfig(tp=2, dp_shard=2, zero_stage=1).validate(4)
    with pytest.raises(ValueError, match="CPUOffloadPolicy"):
        ParallelConfig(offload="optimizer").validate(1)
    with pytest.raises(ValueError, match="DDP"):
        ParallelConfig(dp_replicate=2, tp=2).validate(4)
    assert ParallelConfig(dp_shard=4).effective_zero_stage() == 3
    assert ParallelConfig(dp_replicate=4).effective_zero_stage() == 0
    assert ParallelConfig(dp_replicate=2).uses_ddp() and not ParallelConfig(dp_replicate=2).uses_fsdp()


def test_single_process_fsdp_with_cpu_offload(tiny_shards, tmp_path):
    """ZeRO-3 + offload on one process (a one-process group, no launcher) trains like plain."""
    torch.set_num_threads(1)
    tkw = _train_kw(4, 2, max_steps=3, eval_interval=0)
    plain = train(_cfg(TIED, tkw), tiny_shards, tmp_path / "plain", progress=False)
    z3 = train(_cfg(TIED, tkw, dict(zero_stage=3, offload="optimizer+params")), tiny_shards, tmp_path / "z3",
               progress=False)
    _assert_close([h["loss"] for h in z3.history], [h["loss"] for h in plain.history], "ZeRO-3 + offload")
    assert not torch.distributed.is_initialized()  # the group train() made is gone again


def test_zero1_on_four_ranks_resumes(dist_runs):
    """Saved at step 3 by 4 ZeRO-1 ranks, resumed on the same 4: the uninterrupted run's losses.

    Within 1e-6, not asserted bit for bit: on 4 DDP ranks (ZeRO-1 included) the resumed steps can
    sum gradients in another order than the uninterrupted run (bench/resume_matrix.py measured
    2e-8; FSDP2 resumes bit for bit), most likely because DDP regroups its buckets after a
    process's first step. A lost or misplaced optimizer state moves the loss by 1e-4 or more."""
    full = _run(dist_runs, "zero1_x4")["loss"]
    assert _run(dist_runs, "zero1_x4_save")["loss"] == full[:3]
    assert ck.find_checkpoint(dist_runs["root"] / "zero1_x4_saved").name == "step_0000003"
    _assert_close(_run(dist_runs, "zero1_x4_resume")["loss"], full[3:], "ZeRO-1 4 ranks -> 4 ranks", rel=1e-6)


def test_zero1_four_ranks_resume_on_two(dist_runs):
    """Optimizer states are stored per parameter name, so 2 ZeRO-1 ranks (another split of the
    parameters) find theirs in the 4 ranks' checkpoint."""
    full = _run(dist_runs, "zero1_x4")["loss"]
    _assert_close(_run(dist_runs, "zero1_4_to_2")["loss"], full[3:], "ZeRO-1 4 ranks -> 2 ranks")


@pytest.mark.parametrize("parallel", [dict(zero_stage=1), dict()], ids=["zero1", "plain"])
def test_zero1_four_ranks_resume_on_one_process(dist_runs, tmp_path, parallel):
    """4 ZeRO-1 ranks -> one process, as a one-rank ZeRO-1 group holding every state or as plain AdamW."""
    full = _run(dist_runs, "zero1_x4")["loss"]
    run = tmp_path / "run"
    shutil.copytree(dist_runs["root"] / "zero1_x4_saved", run)
    res = train(_cfg(TIED, _train_kw(2, 4), parallel), _data_of(run), run, resume=True, progress=False)
    _assert_close([h["loss"] for h in res.history], full[3:], f"ZeRO-1 4 ranks -> 1 process {parallel}")


def test_ranks_train_in_rank0s_precision(dist_runs):
    """train.precision auto resolved alike on every rank: rank 1 (which alone would pick bf16)
    trains in rank 0's fp32, so the run is the fp32 DDP run bit for bit."""
    assert _run(dist_runs, "ddp_auto_precision")["loss"] == _run(dist_runs, "ddp")["loss"]
    assert "precision: fp32" in (dist_runs["root"] / "ddp_auto_precision" / "config.yaml").read_text()


def test_consolidated_weights_only_where_rank0_holds_them_whole(dist_runs):
    """DDP and ZeRO-1 checkpoints carry model.safetensors (rank 0 holds every weight), equal to
    their DCP data; FSDP2, TP and PP ones do not (DTensors, or other tensors per rank)."""
    from gptforge.runtime.loading import load_model_checkpoint

    root = dist_runs["root"]
    for name in ("ddp", "zero1"):
        step = ck.find_checkpoint(root / name)
        assert ck.consolidated_problem(step) is None, name
        fast, _ = load_model_checkpoint(step)
        shutil.copytree(step, root / f"{name}_dcp_only")
        (root / f"{name}_dcp_only" / ck.CONSOLIDATED_FILE).unlink()
        slow, _ = load_model_checkpoint(root / f"{name}_dcp_only")
        for k, v in slow.state_dict().items():
            assert torch.equal(fast.state_dict()[k], v), (name, k)
    for name in ("fsdp", "zero2", "tp", "pp_1f1b", "fsdp2_x_tp2", "pp2_x_fsdp2"):
        assert not (ck.find_checkpoint(root / name) / ck.CONSOLIDATED_FILE).exists(), name
