"""train.optimizer muon: parameter split, the orthogonalised update, lr ratio, resume, refusals."""

import math

import pytest
import torch

from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.model import GPT
from gptforge.train.optim import MUON_LR, MuonAdamW, build_optimizer, muon_split, resolve_lr_defaults


def _model(**kw):
    torch.manual_seed(0)
    return GPT(ModelConfig(n_layer=2, n_head=2, d_model=32, vocab_size=50, block_size=16, **kw).resolved())


def test_muon_takes_block_matrices_and_adamw_the_rest():
    m = _model(tie_embeddings=False, value_embeddings=True)
    muon, rest = muon_split(m)
    names = {id(p): n for n, p in m.named_parameters()}
    assert {names[id(p)] for p in muon} == {n for n, p in m.named_parameters()
                                             if n.startswith("blocks.") and p.dim() == 2 and "v_embed" not in n}
    assert {"wte.weight", "wpe.weight", "lm_head.weight", "norm_f.weight", "blocks.1.attn.v_embed.weight",
            "blocks.0.attn.q_proj.bias"} <= {names[id(p)] for p in rest}
    assert sum(p.numel() for p in muon + rest) == m.num_params()
    # muon_lr unset: the resolution's default (MUON_LR).
    opt = build_optimizer(m, resolve_lr_defaults(ModelConfig(d_model=32), TrainConfig(optimizer="muon", lr=1e-3)), "cpu")
    assert isinstance(opt, MuonAdamW) and len(opt.param_groups) == 3
    assert opt.param_groups[0]["muon_lr_ratio"] == pytest.approx(MUON_LR / 1e-3)
    TrainConfig(optimizer="muon").check_trainable()


def test_update_singular_values_are_near_one_in_the_middle():
    """Newton-Schulz output US'V^T: with the lr factors removed, the bulk of the update's singular
    values lies near 1 (Jordan et al. 2024: S' roughly in [0.5, 1.5]), while the gradient's
    spread over three decades."""
    torch.manual_seed(0)
    m = _model(bias=False)
    w = m.blocks[0].mlp.up_proj.weight  # (128, 32): torch's "original" adjustment sqrt(128/32) = 2
    lr, muon_lr = 1e-3, 0.05
    opt = build_optimizer(m, TrainConfig(optimizer="muon", lr=lr, muon_lr=muon_lr, muon_weight_decay=0.0), "cpu")
    u, _ = torch.linalg.qr(torch.randn(128, 32))
    v, _ = torch.linalg.qr(torch.randn(32, 32))
    grad = u @ torch.diag(torch.logspace(0, -3, 32)) @ v.T
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    w.grad = grad.clone()
    before = w.detach().clone()
    opt.step()
    update = (before - w.detach()) / (lr * (muon_lr / lr) * math.sqrt(128 / 32))
    s = torch.linalg.svdvals(update.double())
    g = torch.linalg.svdvals(grad.double())
    assert g.max() / g.min() > 500
    middle = s.sort().values[8:24]  # the middle half of the spectrum
    assert middle.min() > 0.5 and middle.max() < 1.5, s
    assert abs(float(s.median()) - 1.0) < 0.35
    # Matches the direction of the gradient: same singular subspace on top.
    assert torch.sum(update * grad) > 0
    assert opt.param_groups[0]["lr"] == lr  # the schedule's value is restored after the step
    assert not torch.equal(before, w.detach())


def test_refusals():
    m = _model()
    with pytest.raises(ValueError, match="ZeRO-1"):
        build_optimizer(m, TrainConfig(optimizer="muon"), "cpu", zero_group=object())
    with pytest.raises(ValueError, match="lr"):
        build_optimizer(m, TrainConfig(optimizer="muon", lr=0.0), "cpu")


def test_sharded_parameters_are_refused(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    if dist.is_initialized():
        pytest.skip("a process group already exists")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        lin = torch.nn.Linear(8, 8, bias=False)
        p = torch.nn.Parameter(distribute_tensor(lin.weight.detach(), mesh, [Shard(0)]))
        with pytest.raises(ValueError, match="sharded"):
            MuonAdamW([p], [], lr=1e-3, muon_lr=0.02)
    finally:
        dist.destroy_process_group()


def test_muon_resume_is_bit_exact(tiny_shards, tmp_path):
    from gptforge.train.loggers import read_metrics
    from gptforge.train.run import train

    def cfg(**kw):
        return RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32, n_layer=2, d_model=32),
                         train=TrainConfig(max_steps=8, micro_batch_size=4, lr=3e-3, warmup_steps=2,
                                           optimizer="muon", eval_interval=0, checkpoint_interval=0,
                                           tensorboard=False, report=False, spike_alarms=False, **kw))

    train(cfg(), tiny_shards, tmp_path / "full", progress=False)
    part = train(cfg(stop_at_step=4), tiny_shards, tmp_path / "part", progress=False)
    assert part.step == 4
    rest = train(cfg(), tiny_shards, tmp_path / "part", resume=True, progress=False)
    assert rest.step == 8
    a = [r["loss"] for r in read_metrics(tmp_path / "full")]
    b = [r["loss"] for r in read_metrics(tmp_path / "part")]
    assert len(a) == len(b) == 8 and a == b
    assert a[-1] < a[0]


def test_planner_counts_one_momentum_buffer_per_muon_parameter():
    from gptforge.config import ParallelConfig
    from gptforge.plan.memory import estimate_memory, optimizer_state_bytes

    cfg = ModelConfig(preset="gpt2-nano", vocab_size=50, block_size=16).resolved()
    muon, rest = muon_split(GPT(cfg))
    n_muon, n_rest = sum(p.numel() for p in muon), sum(p.numel() for p in rest)
    assert optimizer_state_bytes(cfg, "muon") == 4 * n_muon + 8 * n_rest
    assert optimizer_state_bytes(cfg, "muon") < optimizer_state_bytes(cfg, "adamw")
    est = estimate_memory(cfg, TrainConfig(optimizer="muon", micro_batch_size=2), ParallelConfig())
    assert est.optimizer_states == 4 * n_muon + 8 * n_rest and est.optimizer_temp > 0


def test_checkpoint_written_before_the_model_options_resumes(tiny_shards, tmp_path):
    """A config.yaml without model.qk_norm & co. (an older run) still resumes: missing keys take
    their default (off)."""
    import yaml

    from gptforge.runtime import checkpoint as ck
    from gptforge.train.run import train

    def cfg(**kw):
        return RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32, n_layer=1, d_model=32),
                         train=TrainConfig(max_steps=3, micro_batch_size=2, eval_interval=0, checkpoint_interval=0,
                                           tensorboard=False, report=False, spike_alarms=False, **kw))

    train(cfg(stop_at_step=2), tiny_shards, tmp_path / "run", progress=False)
    found = ck.find_checkpoint(tmp_path / "run")
    saved = yaml.safe_load((found / "config.yaml").read_text())
    for k in ("qk_norm", "zero_init_proj", "logit_softcap", "value_embeddings"):
        saved["model"].pop(k)
    (found / "config.yaml").write_text(yaml.safe_dump(saved))
    assert train(cfg(), tiny_shards, tmp_path / "run", resume=True, progress=False).step == 3


def test_muon_under_ddp_matches_one_process_and_fsdp_is_refused(tiny_shards, tmp_path):
    """Two gloo ranks (DDP, modern model options on) follow the single-process Muon run; FSDP2
    stops before step 1 with the refusal."""
    from gptforge.train.run import train
    from tests.train.dist_harness import run_layouts

    model = dict(arch="llama", n_layer=2, n_head=2, n_kv_head=2, d_model=32, block_size=32, activation="relu2",
                 qk_norm=True, zero_init_proj=True, logit_softcap=15.0, value_embeddings=True)

    def tkw(mbs, gas):
        return dict(max_steps=4, micro_batch_size=mbs, gradient_accumulation_steps=gas, lr=3e-3, warmup_steps=1,
                    optimizer="muon", eval_interval=0, checkpoint_interval=0, tensorboard=False, report=False,
                    spike_alarms=False, seed=7)

    torch.set_num_threads(1)
    ref = train(RunConfig(model=ModelConfig(**model), train=TrainConfig(**tkw(4, 2))), tiny_shards, tmp_path / "ref",
                progress=False)
    jobs = [dict(name=n, model=model, train=tkw(4, 1), parallel=p, data=str(tiny_shards), run_dir=str(tmp_path / n))
            for n, p in (("ddp", dict(dp_replicate=2)), ("fsdp", dict(dp_shard=2)))]
    res = run_layouts(2, jobs, tmp_path / "out")
    assert "error" not in res["ddp"], res["ddp"].get("error")
    want = [r["loss"] for r in ref.history]
    assert len(res["ddp"]["loss"]) == len(want) == 4
    assert want[-1] < want[0] - 0.05  # it trains: a wrong update would show
    for a, b in zip(res["ddp"]["loss"], want, strict=True):
        assert abs(a - b) <= 1e-3 * abs(b)
    assert "sharded parameters" in res["fsdp"]["error"]


def test_planner_activations_follow_the_mlp_and_qk_norm():
    from gptforge.plan.activations import layer_activation_bytes

    base = dict(arch="llama", n_layer=2, n_head=4, d_model=64, d_ff=256, block_size=64, vocab_size=100)
    swiglu = layer_activation_bytes(ModelConfig(**base).resolved(), "fp32", 2)
    relu2 = layer_activation_bytes(ModelConfig(**base, activation="relu2").resolved(), "fp32", 2)
    assert relu2.mlp * 2 == swiglu.mlp  # no gate: half the MLP tensors at equal d_ff
    qk = layer_activation_bytes(ModelConfig(**base, qk_norm=True).resolved(), "fp32", 2)
    assert qk.attention > swiglu.attention and qk.mlp == swiglu.mlp


def test_layout_check_refuses_sharding_before_anything_is_built():
    from gptforge.config import ParallelConfig
    from gptforge.errors import InputError
    from gptforge.train.optim import check_muon_layout

    muon = TrainConfig(optimizer="muon")
    for par, word in ((dict(dp_shard=2), "FSDP2"), (dict(dp_shard=1, tp=2), "tp=2"),
                      (dict(dp_shard=2, zero_stage=1), "zero_stage 1"),
                      (dict(dp_shard=1, backend="deepspeed"), "deepspeed")):
        with pytest.raises(InputError, match=word):
            check_muon_layout(muon, ParallelConfig(**par))
    check_muon_layout(muon, ParallelConfig(dp_replicate=2, dp_shard=1))
    check_muon_layout(muon, ParallelConfig(dp_shard=1, pp=2))
    check_muon_layout(TrainConfig(), ParallelConfig(dp_shard=2))


def test_value_embeddings_train_under_activation_checkpointing(tiny_shards, tmp_path):
    """The token ids reach a wrapped (checkpointed) block: losses equal the unwrapped run's."""
    from gptforge.train.run import train

    def run(mode):
        cfg = RunConfig(model=ModelConfig(preset="modern-nano", block_size=32, value_embeddings=True),
                        train=TrainConfig(max_steps=2, micro_batch_size=2, lr=3e-3, warmup_steps=1, optimizer="muon",
                                          activation_checkpointing=mode, eval_interval=0, checkpoint_interval=0,
                                          tensorboard=False, report=False, spike_alarms=False))
        return [r["loss"] for r in train(cfg, tiny_shards, tmp_path / mode, progress=False).history]

    assert run("full") == run("none")
