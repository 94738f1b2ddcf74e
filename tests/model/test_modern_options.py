"""Model options from the speedrun literature: each changes the forward exactly as documented."""

import pytest
import torch

from gptforge.config import ModelConfig
from gptforge.model import GPT
from gptforge.model.hf import UnsupportedHFConfig, check_exportable, config_to_hf
from gptforge.plan.params import param_count, param_shapes

V = 97


def _cfg(arch="gpt2", **kw):
    base = dict(arch=arch, n_layer=2, n_head=4, n_kv_head=2 if arch == "llama" else 4, d_model=32, block_size=32,
                vocab_size=V)
    return ModelConfig(**{**base, **kw}).resolved()


def _model(arch="gpt2", seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(_cfg(arch, **kw)).eval()


def test_defaults_are_off_and_presets_unchanged():
    cfg = ModelConfig(preset="gpt2-small").resolved()
    assert (cfg.qk_norm, cfg.zero_init_proj, cfg.logit_softcap, cfg.value_embeddings) == (False, False, 0.0, False)
    assert ModelConfig(preset="llama-60m").resolved().d_ff == 1376
    assert config_to_hf(ModelConfig(preset="llama-nano", vocab_size=V))["model_type"] == "llama"


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_relu2_mlp_is_squared_relu_without_gate(arch):
    m = _model(arch, activation="relu2")
    mlp = m.blocks[0].mlp
    assert not hasattr(mlp, "gate_proj") and mlp.up_proj.out_features == 4 * 32
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        want = mlp.down_proj(torch.relu(mlp.up_proj(x)) ** 2)
        torch.testing.assert_close(mlp(x), want)
    assert {p.name for p in param_shapes(m.config)} == {n for n, _ in m.named_parameters()}


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_qk_norm_normalises_each_head(arch):
    m = _model(arch, qk_norm=True)
    attn = m.blocks[0].attn
    assert attn.q_norm.weight.shape == (8,) and attn.k_norm.weight.shape == (8,)
    seen = {}
    attn.q_norm.register_forward_hook(lambda mod, inp, out: seen.setdefault("q", out))
    with torch.no_grad():
        attn.q_norm.weight.fill_(1.0)
        a = m(torch.randint(0, V, (2, 12)))
    # RMS over the head dim is 1 for every head and position (up to the norm's eps).
    rms = seen["q"].pow(2).mean(-1).sqrt()
    assert seen["q"].shape == (2, 4, 12, 8)
    torch.testing.assert_close(rms, torch.ones_like(rms), rtol=0, atol=1e-2)
    plain = _model(arch)
    plain.load_state_dict({k: v for k, v in m.state_dict().items() if "_norm" not in k or "attn" not in k})
    x = torch.randint(0, V, (2, 12))
    with torch.no_grad():
        assert not torch.allclose(plain(x), m(x))
        # Invariance to the scale of q and k is what the norm buys.
        before = m(x)
        attn.k_proj.weight.mul_(3.0)
        if attn.k_proj.bias is not None:
            attn.k_proj.bias.mul_(3.0)
        torch.testing.assert_close(m(x), before, rtol=1e-3, atol=1e-3)
        assert a.shape == before.shape
    assert param_count(m.config) == m.num_params()


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_zero_init_proj_makes_blocks_the_identity(arch):
    m = _model(arch, zero_init_proj=True)
    for b in m.blocks:
        assert not b.attn.o_proj.weight.any() and not b.mlp.down_proj.weight.any()
    x = torch.randint(0, V, (2, 12))
    pos = torch.arange(12)[None]
    with torch.no_grad():
        torch.testing.assert_close(m(x), m.head(m.embed(x, pos)))
        h = torch.randn(2, 12, 32)
        torch.testing.assert_close(m.blocks[0](h, m.rope_at(pos)), h)
    # Off: the blocks are not the identity.
    d = _model(arch)
    with torch.no_grad():
        assert not torch.allclose(d(x), d.head(d.embed(x, pos)))


def test_logit_softcap_bounds_logits():
    m = _model(logit_softcap=2.0)
    plain = _model()
    with torch.no_grad():
        m.lm_head.weight.mul_(100.0)  # tied: raw logits above 2
        plain.load_state_dict(m.state_dict())
        x = torch.randint(0, V, (2, 12))
        raw = plain(x)
        capped = m(x)
    assert raw.abs().max() > 4.0
    assert capped.abs().max() <= 2.0 and (capped.abs() < raw.abs()).all()
    torch.testing.assert_close(capped, 2.0 * torch.tanh(raw / 2.0))
    with pytest.raises(ValueError, match="logit_softcap"):
        _cfg(logit_softcap=-1.0)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_value_embeddings_add_a_token_table_to_the_values(arch):
    cfg = _cfg(arch, n_layer=3, value_embeddings=True)
    torch.manual_seed(0)
    m = GPT(cfg).eval()
    # Every other block counting back from the last: blocks 2 and 0 of 3.
    assert [hasattr(b.attn, "v_embed") for b in m.blocks] == [True, False, True]
    assert m.blocks[0].attn.v_embed.weight.shape == (V, cfg.n_kv_head * cfg.head_dim)
    assert param_count(cfg) == m.num_params() and len(param_shapes(cfg)) == len(list(m.parameters()))
    plain = GPT(_cfg(arch, n_layer=3)).eval()
    x = torch.randint(0, V, (2, 12))
    with torch.no_grad():
        plain.load_state_dict({k: v for k, v in m.state_dict().items() if "v_embed" not in k})
        assert not torch.allclose(plain(x), m(x))
        for b in m.blocks:
            if hasattr(b.attn, "v_embed"):
                b.attn.v_embed.weight.zero_()
        torch.testing.assert_close(m(x), plain(x))  # a zero table is the plain model
        # Incremental decoding with the cache passes the new token ids through.
        m.blocks[0].attn.v_embed.weight.normal_()
        full = m(x)
        caches = m.make_caches(2)
        step = torch.cat([m(x[:, :6], caches=caches), m(x[:, 6:], caches=caches)], dim=1)
        torch.testing.assert_close(step, full, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="value_embeddings"):
        m.blocks[0](torch.randn(1, 4, 32), m.rope_at(torch.arange(4)[None]))


@pytest.mark.parametrize("arch, option, value", [
    ("gpt2", "logit_softcap", 15.0), ("llama", "value_embeddings", True), ("gpt2", "qk_norm", True),
    ("llama", "activation", "relu2"),
])
def test_hf_export_refuses_options_by_name(arch, option, value):
    with pytest.raises(UnsupportedHFConfig, match=f"model.{option}"):
        config_to_hf(_cfg(arch, **{option: value}))


def test_zero_init_proj_exports():
    check_exportable(_cfg("llama", zero_init_proj=True))
    assert config_to_hf(_cfg("llama", qk_norm=True))["model_type"] == "qwen3"
    assert config_to_hf(_cfg("gpt2", activation="relu2"))["activation_function"] == "relu2"


@pytest.mark.parametrize("arch, extra", [("llama", dict(qk_norm=True)), ("gpt2", dict(activation="relu2"))])
def test_mapped_options_export_to_transformers_exactly(arch, extra, tmp_path):
    """llama + qk_norm is Qwen3; gpt2 + relu2 is GPT-2 with activation_function relu2 (offline)."""
    transformers = pytest.importorskip("transformers")
    from gptforge.model.hf import load_hf_model
    from gptforge.model.hf_save import save_hf

    m = _model(arch, **extra)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    out = save_hf(m, m.config, tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == ("Qwen3ForCausalLM" if arch == "llama" else "GPT2LMHeadModel")
    x = torch.randint(0, V, (2, 32))
    with torch.no_grad():
        assert (hf(x).logits - m(x)).abs().max() < 1e-4
        back = load_hf_model(out).eval()
        assert back.config.qk_norm == m.config.qk_norm and back.config.activation == m.config.activation
        assert (back(x) - m(x)).abs().max() < 1e-5


def test_modern_presets_turn_the_options_on_and_refuse_hf_export():
    cfg = ModelConfig(preset="modern-micro", vocab_size=V).resolved()
    assert (cfg.arch, cfg.activation, cfg.qk_norm, cfg.zero_init_proj, cfg.logit_softcap, cfg.tie_embeddings) == \
        ("llama", "relu2", True, True, 15.0, False)
    assert cfg.d_ff == 4 * cfg.d_model and not cfg.value_embeddings
    m = GPT(cfg)
    x = torch.randint(0, V, (1, 8))
    with torch.no_grad():
        assert m(x).abs().max() < 15.0
    with pytest.raises(UnsupportedHFConfig, match="model.logit_softcap"):
        config_to_hf(cfg)
