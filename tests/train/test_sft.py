"""Instruction fine-tuning pieces together: completion-only loss, packed == padded, loss goes down."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch

from gptforge.config import ModelConfig
from gptforge.data.chat import render_example
from gptforge.data.instruct import IGNORE_INDEX, InstructionDataset
from gptforge.model.gpt import GPT
from gptforge.model.lora import LoRAConfig, apply_lora
from gptforge.runtime.loss import token_loss_sum as summed_token_loss

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from test_instruct import CHATML, train_tokenizer  # noqa: E402


def token_loss_sum(logits, labels):
    """(summed loss over counted labels, their count), as the trainer divides a step's loss."""
    return summed_token_loss(logits, labels), (labels != IGNORE_INDEX).sum()


def masked_mean_loss(logits, labels):
    """Mean over counted labels; 0 (not NaN) when none counts."""
    total, count = token_loss_sum(logits, labels)
    return total / count.clamp(min=1)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_tokenizer(tmp_path_factory.mktemp("tok"), chat_template=CHATML)


def _rows(n: int, seed: int = 0) -> list[dict]:
    """A small generated instruction set: reverse / repeat / uppercase a short word."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        word = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 5)))
        task = rng.choice(["reverse", "repeat", "upper"])
        answer = {"reverse": word[::-1], "repeat": word + " " + word, "upper": word.upper()}[task]
        if i % 2:
            rows.append({"prompt": f"{task}: {word}\n", "completion": answer})
        else:
            rows.append({"messages": [{"role": "user", "content": f"{task} {word}"},
                                      {"role": "assistant", "content": answer}]})
    return rows


def _model(arch: str, vocab: int, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(ModelConfig(arch=arch, n_layer=2, n_head=4, n_kv_head=2, d_model=64, block_size=64,
                           vocab_size=vocab).resolved())


def _dataset_loss(model, ds) -> tuple[float, int]:
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ds), 4):
            b = ds.batch(range(start, min(start + 4, len(ds))))
            logits = model(b["input_ids"], position_ids=b["position_ids"], attn_mask=b["attn_mask"])
            assert torch.isfinite(logits).all()
            s, c = token_loss_sum(logits, b["labels"])
            total, count = total + s.item(), count + int(c)
    return total, count


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_equals_padded_loss(tok, arch, attention):
    examples = [render_example(tok, r) for r in _rows(40)]
    packed = InstructionDataset.from_examples(examples, 64, "packed", pad_id=tok.eos_id)
    padded = InstructionDataset.from_examples(examples, 64, "padded", pad_id=tok.eos_id)
    assert len(packed) < len(padded) // 2  # several sequences per row
    model = _model(arch, tok.tokenizer.get_vocab_size()).eval()
    model.config.attention = attention
    for blk in model.blocks:
        blk.attn.eager = attention == "eager"
    s1, c1 = _dataset_loss(model, packed)
    s2, c2 = _dataset_loss(model, padded)
    assert c1 == c2 == packed.stats["target_tokens"]
    assert abs(s1 - s2) / s2 < 1e-5


def test_cross_contamination_would_show(tok):
    """Without the block-diagonal mask and restarted positions the packed loss differs."""
    examples = [render_example(tok, r) for r in _rows(40)]
    packed = InstructionDataset.from_examples(examples, 64, "packed", pad_id=tok.eos_id)
    model = _model("llama", tok.tokenizer.get_vocab_size()).eval()
    b = packed.batch(range(len(packed)))
    with torch.no_grad():
        good = model(b["input_ids"], position_ids=b["position_ids"], attn_mask=b["attn_mask"])
        leaky = model(b["input_ids"])
    counted = b["labels"] != IGNORE_INDEX
    assert (good - leaky)[counted].abs().max() > 1e-2


def test_all_masked_batch_gives_zero_loss_not_nan(tok):
    model = _model("llama", tok.tokenizer.get_vocab_size())
    idx = torch.randint(0, 100, (2, 16))
    labels = torch.full((2, 16), IGNORE_INDEX)
    loss = masked_mean_loss(model(idx), labels)
    assert loss.item() == 0.0
    loss.backward()
    assert all(p.grad is None or (torch.isfinite(p.grad).all() and p.grad.abs().sum() == 0) for p in model.parameters())
    s, c = token_loss_sum(model(idx), labels)
    assert s.item() == 0.0 and c.item() == 0


@pytest.mark.parametrize("lora", [False, True])
def test_instruction_finetune_drives_completion_loss_down(tok, lora):
    ds = InstructionDataset.from_examples([render_example(tok, r) for r in _rows(96)], 64, "packed", pad_id=tok.eos_id)
    model = _model("llama", tok.tokenizer.get_vocab_size())
    if lora:
        apply_lora(model, LoRAConfig(rank=8, alpha=16, target_modules=["all"]))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=3e-2 if lora else 3e-3, weight_decay=0.0)
    start = _dataset_loss(model.eval(), ds)[0] / ds.stats["target_tokens"]
    gen = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(40):
        b = ds.batch(torch.randint(0, len(ds), (8,), generator=gen).tolist())
        loss = masked_mean_loss(model(b["input_ids"], position_ids=b["position_ids"], attn_mask=b["attn_mask"]), b["labels"])
        opt.zero_grad()
        loss.backward()
        opt.step()
    end = _dataset_loss(model.eval(), ds)[0] / ds.stats["target_tokens"]
    if lora:
        # Embeddings and head stay frozen at random values, which limits what adapters can do
        # from a random base; they must still reduce the completion loss clearly.
        assert end < start - 0.2, (start, end)
    else:
        assert end < 0.6 * start, (start, end)
