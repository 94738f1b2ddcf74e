"""QLoRA: 4-bit layer == dequantized linear + adapter, gradients only on adapters, a CLI fine-tune
that learns, bit-exact resume, merged export == the trained 4-bit model in transformers, PEFT
adapter on the dequantized base. CPU only (bitsandbytes' CPU backend); tiny models, no hub."""

from __future__ import annotations

import pytest
import torch

bnb = pytest.importorskip("bitsandbytes")

from gptforge.config import ModelConfig  # noqa: E402
from gptforge.model.gpt import GPT  # noqa: E402
from gptforge.model.lora import LoRAConfig, LoRALinear, lora_parameters  # noqa: E402
from gptforge.model.qlora import (  # noqa: E402
    Linear4bit,
    LoRALinear4bit,
    QLoRAUnavailable,
    QuantConfig,
    apply_qlora,
    check_device,
    dequantize_model,
)


def _model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    cfg = ModelConfig(arch="llama", n_layer=2, n_head=4, n_kv_head=2, d_model=64, block_size=32, vocab_size=61)
    return GPT(cfg.resolved())


@pytest.mark.parametrize("quant_type, double_quant", [("nf4", True), ("nf4", False), ("fp4", True)])
def test_4bit_layer_equals_dequantized_linear_plus_lora(quant_type, double_quant):
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 40)  # 3840 weights: 60 blocks of 64
    qcfg = QuantConfig(quant_type=quant_type, double_quant=double_quant)
    layer = LoRALinear4bit.from_weight(lin.weight, lin.bias, qcfg)
    layer.add_adapter(rank=4, alpha=8, dropout=0.0, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        layer.lora_B.normal_(0, 0.1)
    W = layer.dequantized_weight()
    # A real 4-bit code: close to the original, not equal to it, and about half a byte per weight.
    err = (W - lin.weight).norm() / lin.weight.norm()
    assert 0.01 < err < 0.15, err
    stored = sum(b.numel() * b.element_size() for b in layer.buffers())
    assert stored < 0.6 * lin.weight.numel() + 2048  # + the code books
    assert layer.weight_4bit.dtype == torch.uint8 and layer.weight_4bit.numel() == lin.weight.numel() // 2
    x = torch.randn(3, 7, 96)
    expected = torch.nn.functional.linear(x, W, lin.bias) + 2.0 * (x @ layer.lora_A.T) @ layer.lora_B.T
    assert (layer(x) - expected).abs().max() < 1e-5
    # bf16 compute: the same up to bf16 rounding of x and W.
    layer.compute_dtype = torch.bfloat16
    assert (layer(x) - expected).abs().max() < 0.05 * expected.abs().max()
    # Allocation without quantizing gives the layout bitsandbytes produces (what resume relies on).
    empty = Linear4bit(96, 40, True, qcfg)
    assert {k: (v.shape, v.dtype) for k, v in empty.state_dict().items()} == \
        {k: (v.shape, v.dtype) for k, v in Linear4bit.from_weight(lin.weight, lin.bias, qcfg).state_dict().items()}


def test_only_adapters_get_gradients_and_start_from_the_dequantized_base():
    model = _model()
    names = apply_qlora(model, LoRAConfig(rank=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]),
                        QuantConfig())
    assert len(names) == 2 * 3
    quantized = [n for n, m in model.named_modules() if isinstance(m, Linear4bit)]
    assert len(quantized) == 2 * 7  # every block linear is 4-bit, adapted or not
    n_adapter = sum(p.numel() for p in lora_parameters(model).values())
    assert model.num_params() == _model().num_params() + n_adapter  # packed weights still count
    assert not any(n.endswith(".weight") and ("proj" in n) for n, _ in model.named_parameters())
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == set(lora_parameters(model)) and trainable

    # At init (B = 0) the model computes its dequantized base exactly.
    plain = _model()
    with torch.no_grad():
        for name in quantized:
            parent, leaf = name.rsplit(".", 1)
            getattr(plain.get_submodule(parent), leaf).weight.copy_(model.get_submodule(name).dequantized_weight())
    idx = torch.randint(0, 61, (2, 16))
    with torch.no_grad():
        assert (model(idx) - plain(idx)).abs().max() < 1e-5
        for p in lora_parameters(model).values():
            if p.shape[1] == 4:  # lora_B
                p.normal_(0, 0.1)
    loss = torch.nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
    loss.backward()
    for n, p in model.named_parameters():
        if p.requires_grad:
            # Gradients reach the first layer's adapters through the later 4-bit layers.
            assert p.grad is not None and p.grad.abs().sum() > 0, n
        else:
            assert p.grad is None, n

    # Dequantizing gives plain LoRA layers with the same outputs.
    with torch.no_grad():
        before = model(idx)
        assert dequantize_model(model) == 2 * 7
        assert not any(isinstance(m, Linear4bit) for m in model.modules())
        assert sum(isinstance(m, LoRALinear) for m in model.modules()) == 2 * 3
        assert (model(idx) - before).abs().max() < 1e-5


def test_unavailable_bitsandbytes_or_device_is_named(monkeypatch):
    import sys

    import bitsandbytes.functional as BF

    def refuse(*a, **k):
        raise NotImplementedError("no 4-bit kernel for this device")

    monkeypatch.setattr(BF, "quantize_4bit", refuse)
    with pytest.raises(QLoRAUnavailable, match=r"cannot run 4-bit .* on device cpu.*--finetune.method lora"):
        check_device("cpu")
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    with pytest.raises(QLoRAUnavailable, match=r"pip install 'gptforge\[qlora\]'"):
        check_device("cpu")


# ---------------------------------------------------------------------------------------------
# Through the CLI, on the tiny Qwen2 of test_finetune (GQA, q/k/v biases, tied embeddings)

transformers = pytest.importorskip("transformers")

from gptforge.cli import main  # noqa: E402
from gptforge.train.loggers import read_metrics  # noqa: E402
from tests.train.test_finetune import (  # noqa: E402,F401
    CHATML,
    _finetune,
    instructions,
    train_tokenizer,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    """test_finetune's tiny Qwen2 (GQA, q/k/v biases, tied embeddings, ChatML tokenizer), with
    initializer_range 0.2 instead of 0.02: with the tied embedding frozen, adapters can only move
    the logits as far as the embedding's scale allows, and at 0.02 that is a few tenths of a nat."""
    from transformers import Qwen2Config

    folder = tmp_path_factory.mktemp("hf") / "qwen"
    tok = train_tokenizer(folder, chat_template=CHATML)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=tok.tokenizer.get_vocab_size(), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, tie_word_embeddings=True, eos_token_id=tok.eos_id,
                      initializer_range=0.2)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    return folder


QLORA = ["--finetune.method", "qlora", "--finetune.lora_target_modules", '["all"]', "--finetune.lora_rank", "4",
         "--finetune.lora_alpha", "8"]


def test_qlora_cli_learns_and_exports_the_trained_model(hf_model, instructions, tmp_path):
    peft = pytest.importorskip("peft")
    import torch.distributed.checkpoint as dcp

    from gptforge.model.hf_save import save_hf
    from gptforge.runtime.adapters import load_lora_for_export
    from gptforge.runtime.checkpoint import find_checkpoint, load_model_weights
    from gptforge.runtime.loading import load_model_checkpoint

    run = tmp_path / "run"
    assert _finetune(hf_model, instructions, run, *QLORA, "--train.max_steps", "20", "--train.lr", "3e-2",
                     "--train.eval_interval", "10", "--finetune.val_fraction", "0.1") == 0
    rows = read_metrics(run)
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    assert len(rows) == 20 and len(val) == 2 and val[1] < val[0]
    assert sum(r["loss"] for r in rows[-5:]) / 5 < rows[0]["loss"] - 1.0, [r["loss"] for r in rows]
    assert "method: qlora" in (run / "config.yaml").read_text()
    # The checkpoint stores the packed 4-bit base, no full-precision copy of the block linears.
    step = find_checkpoint(run)
    keys = dcp.FileSystemReader(str(step)).read_metadata().state_dict_metadata
    assert any(k.endswith("q_proj.weight_4bit") for k in keys)
    assert not any(k.endswith("proj.weight") for k in keys)
    assert (run / "adapter" / "adapter_model.safetensors").is_file()

    # The 4-bit model as trained, rebuilt from the checkpoint (not merged).
    trained = GPT(ModelConfig(**__import__("yaml").safe_load((step / "config.yaml").read_text())["model"]).resolved())
    assert load_lora_for_export(trained, step, [k[len("model."):] for k in keys if k.startswith("model.")]) == 2 * 7
    load_model_weights(step, trained)
    assert isinstance(trained.blocks[0].attn.q_proj, LoRALinear4bit)
    idx = torch.randint(0, 400, (2, 24))
    with torch.no_grad():
        ours = trained.eval()(idx)

    out = tmp_path / "merged"
    assert main(["convert", "--to-hf", str(run), "--out", str(out)]) == 0
    merged = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    base = transformers.AutoModelForCausalLM.from_pretrained(hf_model).eval()
    with torch.no_grad():
        theirs = merged(idx).logits
        assert (theirs - ours).abs().max() < 1e-4  # merged export == dequantized base + adapters
        assert (theirs - base(idx).logits).abs().max() > 1e-2

    # The PEFT adapter on the dequantized base computes the same model.
    model, _ = load_model_checkpoint(run)  # dequantized and merged; rebuild the dequantized base alone
    deq = GPT(trained.config)
    load_lora_for_export(deq, step, [k[len("model."):] for k in keys if k.startswith("model.")])
    load_model_weights(step, deq)
    with torch.no_grad():
        for p in lora_parameters(deq).values():
            p.zero_()
    from gptforge.runtime.adapters import merge_for_export

    merge_for_export(deq)
    base_dir = save_hf(deq, deq.config, tmp_path / "deq_base", tokenizer_dir=hf_model,
                       base_config=__import__("json").loads((run / "hf_config.json").read_text()))
    adapted = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(base_dir),
                                             run / "adapter").eval()
    with torch.no_grad():
        assert (adapted(idx).logits - theirs).abs().max() < 1e-4
        assert (model(idx) - ours).abs().max() < 1e-4
    # generate / evaluate load a QLoRA run through the same dequantize-and-merge path.
    from gptforge.runtime.loading import load_for_inference

    loaded, *_ = load_for_inference(run)
    with torch.no_grad():
        assert (loaded(idx) - ours).abs().max() < 1e-4


def test_qlora_resume_is_bit_exact(hf_model, instructions, tmp_path):
    args = [*QLORA, "--train.max_steps", "6", "--train.lr", "1e-2", "--finetune.lora_dropout", "0.1",
            "--train.eval_interval", "3", "--finetune.packing", "padded"]
    assert _finetune(hf_model, instructions, tmp_path / "full", *args) == 0
    assert _finetune(hf_model, instructions, tmp_path / "part", *args, "--train.stop_at_step", "3") == 0
    assert main(["finetune", "--data", str(instructions), "--out", str(tmp_path / "part"), "--resume",
                 "--train.stop_at_step", "0", "--quiet"]) == 0
    a, b = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "part")
    assert [r["loss"] for r in a] == [r["loss"] for r in b] and len(a) == 6
    assert [r.get("val_loss") for r in a] == [r.get("val_loss") for r in b]
    from safetensors.torch import load_file

    ta = load_file(tmp_path / "full" / "adapter" / "adapter_model.safetensors")
    tb = load_file(tmp_path / "part" / "adapter" / "adapter_model.safetensors")
    assert set(ta) == set(tb) and all(torch.equal(ta[k], tb[k]) for k in ta)
