"""Packed shared-context scoring equals scoring each request alone; batch and padding invariance."""

import pytest
import torch

from gptforge.config import ModelConfig
from gptforge.eval.runner import run_task
from gptforge.eval.scoring import encode_pair, loglikelihoods, make_units, score_units
from gptforge.model import GPT
from tests.eval.conftest import write_mc_task


def _naive(model, ctx, cont):
    """lm-eval hf backend's arithmetic: input (ctx + cont)[-(block+1):][:-1], last len(cont) logits."""
    seq = (ctx + cont)[-(model.config.block_size + 1):]
    with torch.no_grad():
        lp = model(torch.tensor(seq[:-1])[None]).log_softmax(-1)[0]
    tgt = torch.tensor(seq[1:])[-len(cont):]
    chosen = lp[-len(cont):]
    return chosen.gather(1, tgt[:, None]).sum().item(), bool((chosen.argmax(-1) == tgt).all())


def test_encode_pair_moves_trailing_space_and_encodes_jointly():
    text = {"ab": [1], "ab c": [1, 2], "a": [3], "abc": [4]}
    enc = text.__getitem__
    # "ab " + "c": the space moves into the continuation; continuation = joint[len(ctx):]
    assert encode_pair(enc, "ab ", "c", 0) == ([1], [2])
    # joint encoding differs from separate: "a" + "bc" encodes "abc" as [4]; ctx [3] -> continuation []
    assert encode_pair(enc, "a", "bc", 0) == ([3], [])
    # empty context -> the prefix (end-of-text) token
    assert encode_pair(enc, "", "ab", 0) == ([0], [1])


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_packed_scores_equal_one_request_at_a_time(arch):
    torch.manual_seed(0)
    m = GPT(ModelConfig(arch=arch, n_layer=2, n_head=2, d_model=32, block_size=16, vocab_size=50).resolved()).eval()
    g = torch.Generator().manual_seed(1)
    pairs = []
    for _ in range(6):
        ctx = torch.randint(0, 50, (int(torch.randint(1, 14, (1,), generator=g)),), generator=g).tolist()
        for _ in range(3):
            n = int(torch.randint(1, 8, (1,), generator=g))
            pairs.append((ctx, torch.randint(0, 50, (n,), generator=g).tolist()))
    units, truncated = make_units(pairs, 16)
    expect_trunc = sum(len(c) + len(x) > 17 for c, x in pairs)
    assert truncated == expect_trunc > 0  # some contexts were cut from the left, and counted
    assert len(units) < len(pairs)  # shared contexts packed together
    ll, greedy = score_units(m, units, len(pairs), batch_size=4)
    for i, (c, x) in enumerate(pairs):
        v, gr = _naive(m, c, x)
        assert ll[i] == pytest.approx(v, abs=1e-5)
        assert greedy[i] == gr


def test_batch_size_and_padding_side_do_not_change_scores(loaded, tmp_path):
    model, tok = loaded
    task = write_mc_task(tmp_path / "mc.jsonl", n=40)
    ref = run_task(model, tok, task, batch_size=1)
    assert ref.n == 40
    for bs in (1, 7, 32):
        for side in ("left", "right"):
            r = run_task(model, tok, task, batch_size=bs, padding_side=side)
            assert r.metrics["acc"]["value"] == ref.metrics["acc"]["value"]
            assert r.metrics["acc_norm"]["value"] == ref.metrics["acc_norm"]["value"]
            for a, b in zip(r.predictions, ref.predictions, strict=True):
                assert a["loglikelihoods"] == pytest.approx(b["loglikelihoods"], abs=1e-5)


def test_loglikelihoods_of_strings(loaded):
    model, tok = loaded
    ll, greedy, truncated = loglikelihoods(model, tok.encode, tok.eos_id,
                                           [("def main(", "self):"), ("def main(", "zzqx")])
    assert truncated == 0
    assert ll[0] > ll[1]  # real code beats gibberish after a model trained on code
    assert all(v < 0 for v in ll)


def test_evaluate_tasks_for_a_training_loop(loaded, tmp_path):
    from gptforge.eval.runner import evaluate_tasks, log_items
    from gptforge.eval.tasks import load_task

    model, tok = loaded
    tasks = [load_task(write_mc_task(tmp_path / "a.jsonl", n=8)), load_task(write_mc_task(tmp_path / "b.jsonl", n=6,
                                                                                          seed=5))]
    model.train()
    scores = evaluate_tasks(model, tok, tasks, device="cpu", precision="fp32", batch_size=8)
    assert model.training  # mode restored
    assert set(scores) == {"a", "b", "core"} and set(scores["a"]) == {"acc", "acc_norm"}
    again = evaluate_tasks(model.eval(), tok, tasks, batch_size=3)
    assert again == scores  # dropout off while scoring: the same figures in train or eval mode
    from gptforge.eval.runner import higher_is_better

    assert higher_is_better("eval/a/acc") and higher_is_better("macro_f1") and higher_is_better("eval/t/f1/pos")
    assert not higher_is_better("eval/p/bits_per_byte") and not higher_is_better("perplexity")
    items = log_items(scores)
    assert items["eval/a/acc"] == scores["a"]["acc"] and "eval/core/centered_acc" in items
