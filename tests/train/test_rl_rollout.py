"""Rollout groups: one fixed batch shape per prompt, seeded by (seed, step, prompt index), old
log-probs from the sampling weights, rewards from eval/rewards."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from gptforge.config import ModelConfig
from gptforge.eval.prompts import render_prompt
from gptforge.eval.rewards import parse_reward
from gptforge.infer.generate import generate_batch
from gptforge.model.gpt import GPT
from gptforge.train.rl.loss import token_logprobs
from gptforge.train.rl.rollout import rollout_seed, sample_group, score_group

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from test_instruct import CHATML, train_tokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_tokenizer(tmp_path_factory.mktemp("tok"), chat_template=CHATML)


@pytest.fixture(scope="module")
def model(tok):
    torch.manual_seed(0)
    return GPT(ModelConfig(arch="llama", n_layer=2, n_head=4, n_kv_head=2, d_model=48, block_size=64,
                           vocab_size=tok.tokenizer.get_vocab_size()).resolved())


def _prompts(tok):
    rows = [{"messages": [{"role": "user", "content": f"What is {a}+{b}?"}], "answer": str(a + b)}
            for a, b in [(2, 3), (10, 4), (7, 7)]]
    return [render_prompt(tok, r, f"train.jsonl:{i + 1}") for i, r in enumerate(rows)]


def _sample(model, tok, prompt, index, step, **kw):
    args = dict(samples=4, max_new_tokens=12, temperature=1.0, seed=5, eos_id=tok.eos_id,
                decode=lambda ids: tok.tokenizer.decode(ids, skip_special_tokens=False))
    return sample_group(model, prompt, index, step, **{**args, **kw})


def test_group_tensors_match_the_generation(model, tok):
    p = _prompts(tok)[0]
    g = _sample(model, tok, p, 0, 3)
    P = len(p.ids)
    gens = generate_batch(model, [p.ids] * 4, 12, temperature=1.0, seed=rollout_seed(5, 3, 0), eos_id=tok.eos_id)
    assert g.prompt_len == P and g.input_ids.shape == (4, P + max(len(x.tokens) for x in gens))
    for b, x in enumerate(gens):
        n = len(x.tokens)
        assert g.input_ids[b, P:P + n].tolist() == x.tokens and g.lengths[b] == n
        assert bool(g.truncated[b]) == (x.finish_reason == "length") == (tok.eos_id not in x.tokens)
        assert (g.input_ids[b, :P].tolist() == p.ids) and not g.completion_mask[b, n:].any()
    # old log-probs: one forward of the same weights at the sampling temperature, 0 on padding
    with torch.no_grad():
        want = token_logprobs(model(g.input_ids[:, :-1])[:, P - 1:], g.input_ids[:, P:])[0] * g.completion_mask
    torch.testing.assert_close(g.old_logprobs, want)
    assert (g.old_logprobs[g.completion_mask] < 0).all()


def test_seeded_by_seed_step_and_prompt_index_alone(model, tok):
    """A group's samples do not depend on which groups were sampled before it (another rank's
    share), and change with the step and with the prompt index."""
    ps = _prompts(tok)
    alone = _sample(model, tok, ps[2], 2, 7)
    _sample(model, tok, ps[0], 0, 7)
    _sample(model, tok, ps[1], 1, 7)
    after = _sample(model, tok, ps[2], 2, 7)
    assert torch.equal(alone.input_ids, after.input_ids) and torch.equal(alone.old_logprobs, after.old_logprobs)
    assert not torch.equal(_sample(model, tok, ps[2], 2, 8).input_ids, alone.input_ids)
    assert rollout_seed(5, 7, 2) != rollout_seed(5, 7, 3) != rollout_seed(5, 8, 2)


def test_truncation_and_rewards(model, tok):
    p = _prompts(tok)[1]
    g = _sample(model, tok, p, 0, 0, max_new_tokens=3, eos_id=tok.tokenizer.get_vocab_size() + 5)  # no EOS
    assert g.truncated.all() and (g.lengths == 3).all()
    g.completions = ["#### 14", "I think 13", "14", "nothing"]
    score_group(g, [parse_reward("exact"), parse_reward("regex:^####", weight=0.5)])
    assert g.reward_parts["exact"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert g.rewards.tolist() == [1.5, 0.0, 1.0, 0.0]


def test_prompt_that_leaves_no_room_is_refused(model, tok):
    p = _prompts(tok)[0]
    with pytest.raises(ValueError, match="train.jsonl:1: the prompt's \\d+ tokens \\+ max_new_tokens 60 exceed"):
        _sample(model, tok, p, 0, 0, max_new_tokens=60)
