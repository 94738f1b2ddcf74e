"""Document masking: a document packed with others gives the logits of that document run alone."""

import pytest
import torch

from gptforge.config import ModelConfig
from gptforge.model.gpt import GPT, document_mask

EOS = 0


def _model(arch: str, attention: str = "sdpa") -> GPT:
    torch.manual_seed(0)
    extra = {"n_kv_head": 1} if arch == "llama" else {}
    cfg = ModelConfig(arch=arch, n_layer=2, n_head=2, d_model=32, block_size=32, vocab_size=50,
                      attention=attention, **extra).resolved()
    return GPT(cfg).eval()


def _documents() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [[EOS] + torch.randint(1, 50, (n,), generator=g).tolist() for n in (5, 8, 3)]


def test_positions_and_mask_of_a_small_window():
    idx = torch.tensor([[7, 8, EOS, 9, EOS, 5, 6]])
    pos, mask = document_mask(idx, EOS)
    assert pos.tolist() == [[0, 1, 0, 1, 0, 1, 2]]
    assert mask.shape == (1, 1, 7, 7)
    docs = [0, 0, 1, 1, 2, 2, 2]
    expected = [[j <= i and docs[i] == docs[j] for j in range(7)] for i in range(7)]
    assert mask[0, 0].tolist() == expected


@pytest.mark.parametrize("arch,attention", [("gpt2", "sdpa"), ("llama", "sdpa"), ("gpt2", "eager"),
                                            ("llama", "eager")])
def test_each_document_equals_it_alone(arch, attention):
    model, docs = _model(arch, attention), _documents()
    packed = torch.tensor([sum(docs, [])])
    pos, mask = document_mask(packed, EOS)
    with torch.no_grad():
        together = model(packed, position_ids=pos, attn_mask=mask)[0]
        plain = model(packed)[0]
        begin = 0
        for d in docs:
            alone = model(torch.tensor([d]))[0]
            part = together[begin : begin + len(d)]
            assert (part - alone).abs().max().item() < 1e-5
            if begin > 0:  # without the mask, later documents see earlier ones: the test can fail
                assert (plain[begin : begin + len(d)] - alone).abs().max().item() > 1e-3
            begin += len(d)


def test_a_batch_masks_each_row_by_its_own_documents():
    model, docs = _model("llama"), _documents()
    rows = torch.tensor([docs[0] + docs[1] + docs[2], docs[2] + docs[0] + docs[1]])
    pos, mask = document_mask(rows, EOS)
    with torch.no_grad():
        out = model(rows, position_ids=pos, attn_mask=mask)
        second = model(rows[1:], position_ids=pos[1:], attn_mask=mask[1:])
    assert (out[1] - second[0]).abs().max().item() < 1e-5
