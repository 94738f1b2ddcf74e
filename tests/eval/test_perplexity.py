import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gptforge.config import ModelConfig
from gptforge.eval.perplexity import evaluate_tokens, sliding_windows, unigram_entropy
from gptforge.model import GPT


@pytest.mark.parametrize("n,block,stride", [(100, 16, 16), (100, 16, 5), (17, 16, 8), (2, 16, 1), (1000, 64, 63)])
def test_windows_score_every_target_once(n, block, stride):
    scored = np.zeros(n, dtype=int)
    for b, e, first in sliding_windows(n, block, stride):
        assert e - b <= block
        for j in range(b + 1, e + 1):
            if j > first:
                scored[j] += 1
    assert scored[0] == 0 and (scored[1:] == 1).all()


def test_disjoint_windows_equal_direct_loss_and_bpb():
    torch.manual_seed(0)
    m = GPT(ModelConfig(n_layer=1, n_head=2, d_model=16, block_size=8, vocab_size=30).resolved()).eval()
    toks = np.random.default_rng(0).integers(0, 30, size=33)  # 32 targets = 4 disjoint windows of 8
    r = evaluate_tokens(m, toks, n_bytes=100, stride=8)
    x = torch.as_tensor(toks[:-1]).view(4, 8)
    y = torch.as_tensor(toks[1:]).view(4, 8)
    with torch.no_grad():
        direct = F.cross_entropy(m(x).reshape(-1, 30), y.reshape(-1)).item()
    assert r.tokens == 32
    assert r.loss == pytest.approx(direct, rel=1e-6)
    assert r.perplexity == pytest.approx(math.exp(direct), rel=1e-6)
    assert r.bits_per_byte == pytest.approx(direct * 32 / math.log(2) / 100, rel=1e-6)
    # More context can only be given with a smaller stride; the count stays the same.
    assert evaluate_tokens(m, toks, stride=3).tokens == 32


def test_unigram_entropy():
    t = np.array([0, 0, 1, 1])
    assert unigram_entropy(t, 4) == pytest.approx(math.log(2))


def test_document_mask_scores_each_document_as_if_alone():
    torch.manual_seed(0)
    m = GPT(ModelConfig(arch="llama", n_layer=2, n_head=2, d_model=16, block_size=32, vocab_size=30).resolved())
    with torch.no_grad():  # weights far from the near-uniform init, so that context matters
        for p in m.parameters():
            p.normal_(0.0, 0.5)
    eos, g = 0, np.random.default_rng(3)
    docs = [[eos, *g.integers(1, 30, size=n).tolist()] for n in (4, 9, 6)]
    packed = np.array(sum(docs, []) + [eos])
    masked = evaluate_tokens(m, packed, stride=32, document_mask_eos=eos)
    # Alone, a document is [EOS, tokens, EOS]: its tokens and the EOS that ends it are its targets.
    alone = [evaluate_tokens(m, np.array(d + [eos]), stride=32).total_nats for d in docs]
    assert masked.tokens == len(packed) - 1
    assert masked.total_nats == pytest.approx(sum(alone), rel=1e-5)
    assert evaluate_tokens(m, packed, stride=32).total_nats != pytest.approx(sum(alone), rel=1e-2)
