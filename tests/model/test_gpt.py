import pytest
import torch

from gptforge.config import ModelConfig
from gptforge.model import GPT


@pytest.mark.parametrize(
    "preset,expected",
    [("gpt2-small", 124_439_808), ("gpt2-medium", 354_823_168), ("gpt2-large", 774_030_080),
     ("gpt2-xl", 1_557_611_200), ("llama-2-7b", 6_738_415_616), ("llama-3-8b", 8_030_261_248)],
)
def test_preset_parameter_counts(preset, expected):
    with torch.device("meta"):
        model = GPT(ModelConfig(preset=preset).resolved())
    assert model.num_params() == expected


def test_overrides_beat_preset_and_unknown_preset_suggests():
    cfg = ModelConfig(preset="gpt2-small", n_layer=2, vocab_size=100).resolved()
    assert (cfg.n_layer, cfg.d_model, cfg.vocab_size, cfg.tie_embeddings) == (2, 768, 100, True)
    with pytest.raises(ValueError, match="gpt2-small"):
        ModelConfig(preset="gpt2-smal").resolved()
    with pytest.raises(ValueError, match="n_kv_head"):
        ModelConfig(n_head=4, n_kv_head=3).resolved()


def _tiny(arch, **kw):
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, n_layer=2, n_head=4, n_kv_head=2 if arch == "llama" else 4, d_model=32,
                      block_size=64, vocab_size=97, **kw).resolved()
    return GPT(cfg).eval()


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_sdpa_equals_eager_and_causality(arch):
    m = _tiny(arch)
    e = GPT(ModelConfig(**{**m.config.__dict__, "attention": "eager"})).eval()
    e.load_state_dict(m.state_dict())
    x = torch.randint(0, 97, (2, 20))
    a, b = m(x), e(x)
    assert a.shape == (2, 20, 97)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # Changing a later token must not change earlier logits.
    x2 = x.clone()
    x2[:, 10] = (x2[:, 10] + 1) % 97
    torch.testing.assert_close(m(x2)[:, :10], a[:, :10])
    assert not torch.allclose(m(x2)[:, 10:], a[:, 10:])


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_kv_cache_matches_full_forward(arch):
    m = _tiny(arch)
    x = torch.randint(0, 97, (3, 17))
    full = m(x)
    caches = m.make_caches(3)
    first = m(x[:, :9], caches=caches)
    rest = [m(x[:, t : t + 1], caches=caches) for t in range(9, 17)]
    inc = torch.cat([first] + rest, dim=1)
    torch.testing.assert_close(inc, full, rtol=1e-5, atol=1e-5)


def test_tied_embeddings_and_init_scale():
    m = _tiny("gpt2")
    assert m.lm_head.weight is m.wte.weight
    std = m.blocks[0].attn.o_proj.weight.std().item()
    assert 0.5 * 0.02 / 2 < std < 1.5 * 0.02 / 2  # 0.02 / sqrt(2 * n_layer) with n_layer = 2
    assert not _tiny("llama").config.tie_embeddings


def test_block_size_is_enforced():
    m = _tiny("gpt2")
    with pytest.raises(ValueError, match="block_size"):
        m(torch.zeros(1, 65, dtype=torch.long))


def test_nonpositive_shapes_are_refused():
    with pytest.raises(ValueError, match="model.block_size must be >= 1"):
        ModelConfig(preset="gpt2-nano", block_size=0).resolved()
    with pytest.raises(ValueError, match="model.dropout"):
        ModelConfig(dropout=1.5).resolved()


def test_select_returns_logits_at_the_chosen_positions_only():
    import torch

    from gptforge.config import ModelConfig
    from gptforge.model import GPT

    torch.manual_seed(0)
    m = GPT(ModelConfig(n_layer=1, n_head=2, d_model=16, block_size=8, vocab_size=20).resolved()).eval()
    idx = torch.randint(0, 20, (3, 8))
    rows, cols = torch.tensor([0, 2, 2]), torch.tensor([7, 0, 5])
    with torch.no_grad():
        full = m(idx)
        sel = m(idx, select=(rows, cols))
    assert sel.shape == (3, 20)
    assert torch.allclose(sel, full[rows, cols], atol=1e-6)
