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
