"""LoRA: gradients only on adapters, merge equals adapted outputs, PEFT loads the saved adapter."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from gptforge.config import ModelConfig
from gptforge.model.gpt import GPT
from gptforge.model.lora import (
    LoRAConfig,
    LoRALinear,
    apply_lora,
    lora_parameters,
    merge_lora,
    save_peft_adapter,
)


def _model(arch: str, n_kv_head: int = 2, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    cfg = ModelConfig(arch=arch, n_layer=2, n_head=4, n_kv_head=n_kv_head, d_model=32, block_size=32, vocab_size=61)
    return GPT(cfg.resolved())


def _randomize_adapters(model):
    with torch.no_grad():
        for p in lora_parameters(model).values():
            p.normal_(0, 0.2)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_only_adapters_get_gradients(arch):
    model = _model(arch)
    names = apply_lora(model, LoRAConfig(rank=4, alpha=8, target_modules=["all"] if arch == "llama" else
                                         ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]))
    assert len(names) == 2 * (7 if arch == "llama" else 5)
    idx = torch.randint(0, 61, (2, 16))
    # At init B = 0: the adapted model computes the base model exactly.
    base = _model(arch)
    with torch.no_grad():
        assert torch.equal(model(idx), base(idx))
    loss = torch.nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
    loss.backward()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == set(lora_parameters(model)) and trainable
    for n, p in model.named_parameters():
        if n.endswith("lora_A"):
            assert p.grad is None or p.grad.abs().sum() == 0  # B = 0 blocks A's gradient at init
        elif n.endswith("lora_B"):
            assert p.grad is not None and p.grad.abs().sum() > 0, n
        else:
            assert p.grad is None, n
    n_adapter = sum(p.numel() for p in lora_parameters(model).values())
    assert n_adapter < 0.5 * base.num_params()


def test_state_dict_names_kept_and_dropout_only_in_training():
    model = _model("llama")
    before = set(model.state_dict())
    apply_lora(model, LoRAConfig(rank=2, dropout=0.5))
    after = set(model.state_dict())
    assert before <= after and all(k.endswith(("lora_A", "lora_B")) for k in after - before)
    _randomize_adapters(model)
    idx = torch.randint(0, 61, (1, 8))
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(idx), model(idx))
        model.train()
        assert not torch.equal(model(idx), model.eval()(idx))


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_merge_equals_adapted_outputs(arch):
    model = _model(arch)
    apply_lora(model, LoRAConfig(rank=4, alpha=16, target_modules=["q_proj", "k_proj", "up_proj", "down_proj"]))
    _randomize_adapters(model)
    model.eval()
    idx = torch.randint(0, 61, (2, 20))
    with torch.no_grad():
        adapted = model(idx)
        plain = _model(arch).eval()(idx)
        assert (adapted - plain).abs().max() > 1e-2  # the adapters do something
        assert merge_lora(model) == 2 * 4
        merged = model(idx)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    assert set(model.state_dict()) == set(_model(arch).state_dict())
    assert (merged - adapted).abs().max() < 1e-5


def test_bad_config_is_named():
    with pytest.raises(ValueError, match="lora.target_modules"):
        apply_lora(_model("llama"), LoRAConfig(target_modules=["qkv"]))
    with pytest.raises(ValueError, match="matched no linear"):
        apply_lora(_model("gpt2"), LoRAConfig(target_modules=["gate_proj"]))
    with pytest.raises(ValueError, match="rank"):
        apply_lora(_model("gpt2"), LoRAConfig(rank=0))


@pytest.mark.parametrize("arch, targets, n_kv_head", [
    ("llama", ["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"], 2),
    ("gpt2", ["q_proj", "v_proj", "o_proj", "up_proj"], 4),  # q/v fused into c_attn with rank 2r
    ("gpt2", ["k_proj"], 2),                                 # grouped K heads repeated for HF
])
def test_peft_loads_saved_adapter(arch, targets, n_kv_head, tmp_path):
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from gptforge.model.hf_save import save_hf

    model = _model(arch, n_kv_head=n_kv_head)
    base_dir = save_hf(model, model.config, tmp_path / "base")
    lcfg = LoRAConfig(rank=3, alpha=6, target_modules=targets)
    apply_lora(model, lcfg)
    _randomize_adapters(model)
    model.eval()
    adapter = save_peft_adapter(model, model.config, lcfg, tmp_path / "adapter", base_model_name_or_path=str(base_dir))
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 3

    hf = transformers.AutoModelForCausalLM.from_pretrained(base_dir)
    peft_model = peft.PeftModel.from_pretrained(hf, adapter).eval()
    idx = torch.randint(0, 61, (2, 20))
    with torch.no_grad():
        ours = model(idx)
        theirs = peft_model(idx).logits
        base_out = transformers.AutoModelForCausalLM.from_pretrained(base_dir).eval()(idx).logits
    assert (theirs - base_out).abs().max() > 2e-3  # PEFT really applied the adapter
    assert (theirs - ours).abs().max() < 1e-4

    # Merged export == PEFT's merge_and_unload == our adapted model.
    merge_lora(model)
    merged_dir = save_hf(model, model.config, tmp_path / "merged")
    merged = transformers.AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    with torch.no_grad():
        assert (merged(idx).logits - ours).abs().max() < 1e-4
        assert (peft_model.merge_and_unload()(idx).logits - ours).abs().max() < 1e-4


def test_adapters_disabled_gives_the_base_model_and_restores_them():
    from gptforge.model.lora import adapters_disabled

    torch.manual_seed(0)
    cfg = ModelConfig(arch="llama", n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_ff=64, block_size=16,
                      vocab_size=50).resolved()
    base = GPT(cfg)
    model = copy.deepcopy(base)
    apply_lora(model, LoRAConfig(rank=4, alpha=8, target_modules=["all"]))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("lora_B"):
                p.normal_()  # adapters that change the output
    x = torch.randint(0, 50, (2, 16))
    adapted = model(x)
    assert not torch.allclose(adapted, base(x))
    with adapters_disabled(model):
        torch.testing.assert_close(model(x), base(x))
    torch.testing.assert_close(model(x), adapted)
