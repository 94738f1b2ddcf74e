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


def test_rows_put_each_completion_in_the_next_token_frame(model, tok):
    """The policy's log-probs over the batched rows (groups of different prompt lengths, right-padded)
    equal each group's old log-probs at the loss mask's positions."""
    from gptforge.train.rl.batch import rollout_rows, rows_logprobs, split_rows

    ps = _prompts(tok)
    groups = [_sample(model, tok, p, i, 1) for i, p in enumerate(ps)]
    for g, r in zip(groups, ([1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.5, 1.0, 0.5]), strict=True):
        g.rewards = torch.tensor(r)
    rows = rollout_rows(groups, scale_rewards=False, mask_overlong=False)
    B, L = rows["input_ids"].shape
    assert B == 12 and L == max(g.input_ids.size(1) for g in groups)
    assert rows["loss_mask"].sum() == sum(int(g.completion_mask.sum()) for g in groups)
    torch.testing.assert_close(rows["advantages"][:4], torch.tensor([0.75, -0.25, -0.25, -0.25]))
    assert rows["advantages"][4:8].abs().max() == 0
    with torch.no_grad():
        logp = torch.cat([rows_logprobs(model, part, 1.0)[0] for part in split_rows(rows, 5)])
    torch.testing.assert_close(logp[rows["loss_mask"]], rows["old_logprobs"][rows["loss_mask"]], rtol=1e-5, atol=1e-5)
    assert [len(p["advantages"]) for p in split_rows(rows, 5)] == [2, 2, 3, 2, 3]  # 12 * i // 5


def test_overlong_penalty_mask_dynamic_sampling_and_metrics(model, tok):
    from gptforge.train.rl.batch import kept_groups, rollout_rows, shape_rewards

    ps = _prompts(tok)
    groups = [_sample(model, tok, p, i, 2, max_new_tokens=4, eos_id=tok.tokenizer.get_vocab_size() + 1)
              for i, p in enumerate(ps[:2])]
    for g, r in zip(groups, ([1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]), strict=True):
        g.rewards, g.reward_parts = torch.tensor(r), {"exact": torch.tensor(r)}
    assert kept_groups(groups, "drop") == [groups[0]] and kept_groups(groups, "off") == groups
    m = _sampler(tok, ps)._global_metrics(groups, kept_groups(groups, "drop"), 0.0)
    assert m["zero_variance_share"] == 0.5 and m["groups_kept_share"] == 0.5 and m["completion_cut_share"] == 1.0
    assert m["reward_mean"] == 0.75 and m["completion_length_max"] == 4 and m["reward/exact"] == 0.75
    assert not rollout_rows(groups, False, mask_overlong=True)["loss_mask"].any()  # every completion was cut
    shape_rewards(groups, "penalty", max_new_tokens=4, ramp=2)  # length 4 = L_max: -1
    assert groups[0].rewards.tolist() == [0.0, -1.0, 0.0, -1.0] and groups[0].reward_parts["overlong"].tolist() == [-1.0] * 4


def test_lora_reference_is_the_base(tok):
    from gptforge.model.lora import LoRAConfig, apply_lora
    from gptforge.train.rl.batch import adapters_off

    torch.manual_seed(1)
    m = GPT(ModelConfig(arch="llama", n_layer=1, n_head=2, n_kv_head=2, d_model=16, block_size=16,
                        vocab_size=50).resolved())
    x = torch.randint(0, 50, (2, 8))
    with torch.no_grad():
        base = m(x)
        apply_lora(m, LoRAConfig(rank=2))
        for n, p in m.named_parameters():
            if "lora_B" in n:
                p.normal_()
        tuned = m(x)
        with adapters_off(m):
            off = m(x)
        again = m(x)
    assert not torch.allclose(tuned, base)
    torch.testing.assert_close(off, base)
    torch.testing.assert_close(again, tuned)


def test_heldout_evaluation_writes_samples(model, tok, tmp_path):
    import json

    from gptforge.train.rl.heldout import evaluate_prompts

    ps = _prompts(tok)
    out = tmp_path / "samples" / "step_3.jsonl"
    m = evaluate_prompts(model, ps, [parse_reward("regex:.")], 6, tok.eos_id,
                         lambda ids: tok.tokenizer.decode(ids, skip_special_tokens=False), out, batch_size=2)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["where"] for x in lines] == [p.where for p in ps]
    assert m["pass@1"] == sum(x["reward"] for x in lines) / 3 == m["reward/regex:."]
    greedy = generate_batch(model, [ps[2].ids], 6, temperature=0.0, eos_id=tok.eos_id,
                            decode=lambda ids: tok.tokenizer.decode(ids, skip_special_tokens=False))[0]
    assert lines[2]["completion"] == greedy.text  # batched with another prompt == alone


def _sampler(tok, prompts, dp_rank=0, dp_size=1, **cfg):
    from gptforge.config import RLConfig
    from gptforge.train.rl.sampler import RolloutSampler

    c = RLConfig(samples_per_prompt=3, prompts_per_step=2, max_new_tokens=6, **cfg)
    return RolloutSampler(prompts, [parse_reward("regex:[0-9]")], c, seed=11, eos_id=tok.eos_id,
                          decode=lambda ids: tok.tokenizer.decode(ids, skip_special_tokens=False),
                          dp_rank=dp_rank, dp_size=dp_size)


def test_sampler_same_completions_on_two_ranks_and_after_a_state_round_trip(model, tok, tmp_path):
    """Rank 0 and rank 1 of 2 hold the groups that one process samples (stream position q on rank
    q % 2), so the rollout rows are the same tokens; a saved and reloaded sampler serves the same
    mini-batch without sampling again."""
    ps = _prompts(tok) * 2
    one = _sampler(tok, ps, updates_per_batch=2)
    two = [_sampler(tok, ps, r, 2, updates_per_batch=2) for r in (0, 1)]
    for sampler in (one, *two):
        sampler.mini_batch(model, 2)  # step 2 = rollout batch 1, mini-batch 0
    k = one.batch_index
    assert k == 1 and all(s.batch_index == 1 for s in two)
    G, U = 3, 2
    for u in range(U):
        n_u = G * (u + 1) // U - G * u // U  # completions of each group in mini-batch u
        for r, s in enumerate(two):  # rank r holds group r of the batch (stream position q = 2 + r)
            mine = s.minis[u]["input_ids"]
            want = one.minis[u]["input_ids"][r * n_u:(r + 1) * n_u]
            assert mine.size(0) == n_u and torch.equal(mine[:, :want.size(1)], want[:, :mine.size(1)])
    assert one.prompt_at(0) != one.prompt_at(1) and sorted(one.prompt_at(q) for q in range(6)) == list(range(6))
    path = tmp_path / "sampler.pt"
    torch.save(one.state_dict(), path)
    again = _sampler(tok, ps, updates_per_batch=2)
    again.load_state_dict(torch.load(path, weights_only=True))
    assert torch.equal(again.mini_batch(model, 3)["input_ids"], one.mini_batch(model, 3)["input_ids"])
    assert again.metrics == one.metrics and 0 <= one.metrics["reward_mean"] <= 1


def test_dynamic_sampling_masks_groups_without_variance(model, tok):
    ps = _prompts(tok)
    s = _sampler(tok, ps, dynamic_sampling="drop")
    s.rewards = [parse_reward("regex:.*")]  # every completion scores 1: no group has variance
    rows = s.mini_batch(model, 0)
    assert not rows["loss_mask"].any() and s.metrics["zero_variance_share"] == 1.0
    assert s.metrics["groups_kept_share"] == 0.0
