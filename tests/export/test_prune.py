import pytest
import torch

from gptforge.config import ModelConfig
from gptforge.errors import InputError
from gptforge.export.calibration import calibration_batches
from gptforge.export.prune import (
    PruneShape,
    activation_importance,
    head_plan,
    kept_heads,
    prune_model,
    prune_run,
    shape_for_params,
)
from gptforge.model.gpt import GPT
from gptforge.runtime.loading import load_for_inference


def _model(**kw):
    torch.manual_seed(0)
    cfg = dict(arch="llama", n_layer=3, n_head=6, n_kv_head=3, d_model=48, d_ff=64, block_size=16, vocab_size=50)
    cfg.update(kw)
    return GPT(ModelConfig(**cfg).resolved()).eval()


def _batches(n=2):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 50, (2, 16), generator=g) for _ in range(n)]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_pruning_to_the_same_size_is_the_identity(arch):
    model = _model(arch=arch, **({"n_kv_head": 6} if arch == "gpt2" else {}))
    imp = activation_importance(model, _batches())
    same, info = prune_model(model, imp, PruneShape())
    assert same.config == model.config and info["layers_kept"] == [0, 1, 2]
    x = _batches(1)[0]
    assert torch.equal(same(x), model(x))


def test_pruned_heads_and_channels_compute_what_the_kept_structure_computed():
    model = _model()
    imp = activation_importance(model, _batches())
    pruned, info = prune_model(model, imp, PruneShape(heads_per_layer=3, d_ff=40))  # 1 query head per KV group
    assert (pruned.config.n_head, pruned.config.n_kv_head, pruned.config.d_ff) == (3, 3, 40)
    # The same function: the original model with the removed heads' and channels' outputs zeroed.
    ref = _model()
    hd = model.config.head_dim
    with torch.no_grad():
        for l, block in enumerate(ref.blocks):
            q, _kv = kept_heads(model.config, imp.heads[l], 3)
            drop_h = sorted(set(range(6)) - set(q.tolist()))
            for h in drop_h:
                block.attn.o_proj.weight[:, h * hd:(h + 1) * hd] = 0
            order = torch.sort(imp.channels[l], descending=True, stable=True).indices
            block.mlp.down_proj.weight[:, order[40:]] = 0
    x = _batches(1)[0]
    assert torch.allclose(pruned(x), ref(x), atol=1e-5)


def test_whole_gqa_groups_and_layers_go():
    model = _model()
    imp = activation_importance(model, _batches())
    pruned, info = prune_model(model, imp, PruneShape(heads_per_layer=4, n_layer=2))  # 2 of 3 groups of 2
    assert (pruned.config.n_head, pruned.config.n_kv_head, pruned.config.n_layer) == (4, 2, 2)
    dropped = ({0, 1, 2} - set(info["layers_kept"])).pop()
    assert float(imp.layers[dropped]) == float(imp.layers.min())
    ref = _model()
    hd = model.config.head_dim
    with torch.no_grad():
        for l, block in enumerate(ref.blocks):
            _q, kv = kept_heads(model.config, imp.heads[l], 4)
            for g in sorted({0, 1, 2} - set(kv.tolist())):
                block.attn.o_proj.weight[:, 2 * g * hd:(2 * g + 2) * hd] = 0
    del ref.blocks[dropped]
    ref.config.n_layer = 2
    x = _batches(1)[0]
    assert torch.allclose(pruned(x), ref(x), atol=1e-5)


def test_bad_shapes_are_named():
    cfg = _model().config
    assert head_plan(cfg, 3) == (3, "queries") and head_plan(cfg, 2) == (1, "groups")
    with pytest.raises(InputError, match="--heads-per-layer 5 does not keep the GQA groups"):
        head_plan(cfg, 5)
    have = _model().num_params()
    with pytest.raises(InputError, match="more than the model's"):
        shape_for_params(cfg, have + 1)
    assert shape_for_params(cfg, have) == PruneShape()
    with pytest.raises(InputError, match="smaller than one calibration batch"):
        calibration_batches(torch.arange(20).numpy(), 16, 2, 4)


def test_target_params_and_the_pruned_run_loads_and_trains(llama_run, tiny_shards, tmp_path):
    from gptforge.cli import main

    model, *_ = load_for_inference(llama_run, "cpu")
    target = model.num_params() // 2
    out = tmp_path / "pruned"
    report = prune_run(llama_run, out, tiny_shards, target_params=target, num_batches=2)
    assert target * 0.8 < report["params_after"] <= target
    small, _, doc, tok = load_for_inference(out, "cpu")
    assert small.num_params() == report["params_after"] and tok is not None and "pruning" in doc
    ft = tmp_path / "ft"
    assert main(["finetune", "--from", str(out), "--data", str(tiny_shards), "--out", str(ft), "--finetune.method",
                 "full", "--train.max_steps", "2", "--train.micro_batch_size", "2", "--train.eval_interval", "0",
                 "--train.tensorboard", "false", "--train.warmup_steps", "1"]) == 0
    trained, *_ = load_for_inference(ft, "cpu")
    assert trained.config.d_model == small.config.d_model
    assert not torch.equal(trained.blocks[0].mlp.up_proj.weight, small.blocks[0].mlp.up_proj.weight)
    with pytest.raises(InputError, match="smaller than one calibration batch"):
        prune_run(llama_run, tmp_path / "x", tiny_shards, target_params=target, batch_size=10**5)
    with pytest.raises(InputError, match="either --target-params or a shape"):
        prune_run(llama_run, tmp_path / "x", tiny_shards)


def test_magnitude_sparsity_is_reported_honestly():
    from gptforge.export.prune import magnitude_prune

    model = _model()
    before = {n: p.clone() for n, p in model.named_parameters()}
    r = magnitude_prune(model, 0.5)
    assert r["zeros_in_block_linears"] == pytest.approx(0.5, abs=0.01)
    assert 0 < r["zeros_in_model"] < r["zeros_in_block_linears"]
    # Only small weights were zeroed; the rest are unchanged, and nothing outside the blocks moved.
    w, w0 = model.blocks[0].mlp.up_proj.weight, before["blocks.0.mlp.up_proj.weight"]
    assert torch.equal(w[w != 0], w0[w != 0])
    assert torch.equal(model.wte.weight, before["wte.weight"])
    with pytest.raises(InputError, match="--sparsity"):
        magnitude_prune(model, 1.0)
