"""The GRPO / DAPO loss checked by its gradient: against the equations written out here, and
against TRL's GRPOTrainer loss on a tiny Hugging Face model with the same inputs.

The loss value is no check (with fresh rollouts it is 0 for any code), so every comparison is of
gradients, on fixed completions, rewards and old log-probs that differ from the current ones by
up to +-0.6 nats, so that both clip bounds act (asserted through the clip fractions).
"""

from __future__ import annotations

import math

import pytest
import torch

from gptforge.config import ModelConfig
from gptforge.model.gpt import GPT
from gptforge.train.rl.loss import (
    dynamic_sampling_keep,
    group_advantages,
    overlong_penalty,
    policy_loss,
    token_logprobs,
)

pytestmark = pytest.mark.usefixtures("one_thread")

N, G, P, T, V = 2, 4, 3, 6, 40
EPS_LOW, EPS_HIGH, TEMPERATURE = 0.2, 0.28, 0.7


def reference_loss(logp, old, rewards, mask, unit, scale, beta=0.0, ref=None):
    """GRPO (unit "sequence", DeepSeekMath eq. 3) / DAPO (unit "token", DAPO eq. 8), one term at a time:

    A_i = (r_i - mean_g r) [/ (std_g r + 1e-4)],  std unbiased
    rho_it = exp(logp_it - old_it)
    l_it = -min(rho_it A_i, clip(rho_it, 1 - eps_low, 1 + eps_high) A_i) + beta (exp(d) - d - 1), d = ref_it - logp_it
    token:    L = sum_{i,t} m_it l_it / sum_{i,t} m_it
    sequence: L = 1/(N G) sum_i (sum_t m_it l_it / sum_t m_it)
    """
    total, count = 0.0, 0
    for n in range(rewards.shape[0]):
        r = [float(x) for x in rewards[n]]
        mean = sum(r) / len(r)
        std = math.sqrt(sum((x - mean) ** 2 for x in r) / (len(r) - 1))
        for g in range(len(r)):
            i = n * len(r) + g
            A = (r[g] - mean) / (std + 1e-4) if scale else r[g] - mean
            seq, length = 0.0, 0
            for t in range(mask.shape[1]):
                if not mask[i, t]:
                    continue
                rho = torch.exp(logp[i, t] - old[i, t])
                l_it = -torch.minimum(rho * A, torch.clamp(rho, 1 - EPS_LOW, 1 + EPS_HIGH) * A)
                if beta:
                    d = ref[i, t] - logp[i, t]
                    l_it = l_it + beta * (torch.exp(d) - d - 1)
                seq, length = seq + l_it, length + 1
            if unit == "token":
                total, count = total + seq, count + length
            else:
                total, count = total + seq / length, count + 1
    return total / count


def _batch(seed=0):
    """Fixed completions (B, P+T), mask (B, T) with ragged lengths, rewards (N, G), perturbations."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (N * G, P + T), generator=g)
    lengths = torch.tensor([6, 3, 5, 1, 4, 6, 2, 5])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.2, 1.0, 0.0, 0.5]])
    shift = (torch.rand(N * G, T, generator=g) - 0.5) * 1.2  # old = current + shift: ratios in e^[-0.6, 0.6]
    ref_shift = (torch.rand(N * G, T, generator=g) - 0.5) * 0.8
    return ids, mask, rewards, shift, ref_shift


def _model():
    torch.manual_seed(0)
    return GPT(ModelConfig(arch="llama", n_layer=2, n_head=4, n_kv_head=2, d_model=32, block_size=16,
                           vocab_size=V).resolved())


def _grads(model, fn):
    model.zero_grad()
    fn().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("unit, scale, beta", [("token", False, 0.0), ("sequence", True, 0.0),
                                               ("token", True, 0.05), ("sequence", False, 0.05)])
def test_gradient_matches_the_equations(unit, scale, beta):
    model = _model()
    ids, mask, rewards, shift, ref_shift = _batch()

    def logp():
        return token_logprobs(model(ids[:, :-1])[:, P - 1:], ids[:, P:], TEMPERATURE)[0]

    with torch.no_grad():
        now = logp()
    old, ref = now + shift, now + ref_shift

    def ours():
        out = policy_loss(logp(), old, group_advantages(rewards, scale).flatten(), mask, EPS_LOW, EPS_HIGH,
                          unit, beta, ref)
        assert out.metrics["clip_low"] > 0 and out.metrics["clip_high"] > 0  # both bounds act
        return out.loss_sum / out.count

    got = _grads(model, ours)
    want = _grads(model, lambda: reference_loss(logp(), old, rewards, mask, unit, scale, beta, ref))
    assert got.keys() == want.keys() and len(got) > 4
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-7, msg=name)
    assert max(g.abs().max() for g in got.values()) > 1e-4  # a real gradient, not zeros on both sides


def test_micro_batches_sum_to_the_whole_batch_gradient():
    """Split into micro-batches, each loss_sum divided by the WHOLE batch's count (all-reduced
    before the backward, as the trainer does): the same gradient as one pass over the batch."""
    model = _model()
    ids, mask, rewards, shift, _ = _batch(1)
    adv = group_advantages(rewards).flatten()
    with torch.no_grad():
        old = token_logprobs(model(ids[:, :-1])[:, P - 1:], ids[:, P:])[0] + shift
    for unit in ("token", "sequence"):
        def whole(unit=unit):
            out = policy_loss(token_logprobs(model(ids[:, :-1])[:, P - 1:], ids[:, P:])[0], old, adv, mask, unit=unit)
            return out.loss_sum / out.count

        def split(unit=unit):
            parts = [policy_loss(token_logprobs(model(ids[s, :-1])[:, P - 1:], ids[s, P:])[0], old[s], adv[s], mask[s],
                                 unit=unit) for s in (slice(0, 3), slice(3, 8))]
            count = sum(p.count for p in parts)
            return sum(p.loss_sum for p in parts) / count

        a, b = _grads(model, whole), _grads(model, split)
        for name in a:
            torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-8)


def test_token_gradient_is_zero_exactly_where_clipped():
    """dL/dlogp_it = -A_i rho_it m_it / count where the min picks the unclipped term, 0 where it is clipped."""
    torch.manual_seed(3)
    logp = (torch.randn(4, 5) - 2).requires_grad_()
    old = logp.detach() + torch.tensor([-0.5, -0.1, 0.0, 0.1, 0.5])
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    mask = torch.ones(4, 5, dtype=torch.bool)
    out = policy_loss(logp, old, adv, mask, 0.2, 0.28, "token")
    (out.loss_sum / out.count).backward()
    rho = torch.exp(logp.detach() - old)
    clipped = ((rho > 1.28) & (adv[:, None] > 0)) | ((rho < 0.8) & (adv[:, None] < 0))
    want = torch.where(clipped, 0.0, -adv[:, None] * rho / 20)
    torch.testing.assert_close(logp.grad, want)
    assert clipped.sum() == 4 and out.metrics["clip_high"] == 2 and out.metrics["clip_low"] == 2


def test_fresh_rollout_loss_value_is_minus_mean_advantage():
    logp = torch.randn(4, 3)
    adv = group_advantages(torch.tensor([[1.0, 0.0, 1.0, 0.0]])).flatten()
    out = policy_loss(logp, logp.clone(), adv, torch.ones(4, 3, dtype=torch.bool), unit="sequence")
    assert abs(out.loss_sum.item()) < 1e-6 and out.count == 4 and out.metrics["clip_low"] == 0


def test_advantages_filter_and_overlong_penalty():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    torch.testing.assert_close(group_advantages(r), torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.0] * 4]))
    std = math.sqrt(4 * 0.25 / 3)
    torch.testing.assert_close(group_advantages(r, True)[0], torch.tensor([0.5, -0.5, -0.5, 0.5]) / (std + 1e-4))
    assert dynamic_sampling_keep(r).tolist() == [True, False]
    with pytest.raises(ValueError, match="at least 2 samples per prompt.*--rl.samples_per_prompt"):
        group_advantages(torch.ones(3, 1))
    # DAPO eq. 13 with L_max 16, L_cache 4: 0 up to 12 tokens, then -1/4 per token, -1 at 16.
    got = overlong_penalty(torch.tensor([5, 12, 13, 14, 16]), 16, 4)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0]))


def test_bad_shapes_and_missing_reference():
    with pytest.raises(ValueError, match="must be \\(B, T\\)"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="kl_beta > 0 needs ref_logprobs"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3), kl_beta=0.1)


# ---------------------------------------------------------------------------------------------
# Against TRL's GRPOTrainer (pinned in the test extra)


def _trl_trainer(tmp_path, loss_type: str, beta: float):
    pytest.importorskip("trl", reason="TRL (the test extra pins it) is not installed")
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOConfig, GRPOTrainer

    vocab = {f"w{i}": i for i in range(V - 2)} | {"<eos>": V - 2, "<pad>": V - 1}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", pad_token="<pad>")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
                     ).save_pretrained(tmp_path / "model")  # a folder: with beta > 0 TRL loads its reference from it
    # bf16 off (TRL's default is on); use_bias_correction_kl off: TRL 1.x multiplies the KL term by the
    # ratio (DeepSeek-V3.2); gptforge's k3 term is DeepSeekMath's, without it.
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=N * G, num_generations=G,
                      loss_type=loss_type, epsilon=EPS_LOW, epsilon_high=EPS_HIGH, beta=beta, report_to=[],
                      use_cpu=True, bf16=False, use_bias_correction_kl=False, max_completion_length=T,
                      temperature=TEMPERATURE)
    trainer = GRPOTrainer(model=str(tmp_path / "model"), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=args, train_dataset=Dataset.from_list([{"prompt": "w1 w2 w3"}] * (N * G)),
                          processing_class=tok)
    model = trainer.model
    trainer.current_gradient_accumulation_steps = 1  # set by TRL's training_step; one micro-batch here
    return trainer, model


@pytest.mark.parametrize("loss_type, unit, beta", [("dapo", "token", 0.0), ("grpo", "sequence", 0.04)])
def test_gradient_matches_trl_grpo_trainer(tmp_path, loss_type, unit, beta):
    trainer, model = _trl_trainer(tmp_path, loss_type, beta)
    model.train()
    ids, mask, rewards, shift, ref_shift = _batch(2)
    adv = group_advantages(rewards, scale_rewards=True).flatten()

    def logp():
        logits = model(input_ids=ids, attention_mask=torch.cat([torch.ones(N * G, P, dtype=torch.long), mask.long()], 1)).logits
        return token_logprobs(logits[:, P - 1:-1], ids[:, P:], TEMPERATURE)[0]

    with torch.no_grad():
        now = logp()
    old, ref = (now + shift) * mask, (now + ref_shift) * mask
    inputs = {"prompt_ids": ids[:, :P], "prompt_mask": torch.ones(N * G, P, dtype=torch.long),
              "completion_ids": ids[:, P:], "completion_mask": mask.long(), "advantages": adv,
              "old_per_token_logps": old, "ref_per_token_logps": ref, "num_items_in_batch": mask.sum()}

    def ours():
        out = policy_loss(logp(), old, adv, mask, EPS_LOW, EPS_HIGH, unit, beta, ref)
        assert out.metrics["clip_low"] > 0 and out.metrics["clip_high"] > 0
        return out.loss_sum / out.count

    want = _grads(model, lambda: trainer._compute_loss(model, inputs))
    got = _grads(model, ours)
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-7, msg=name)
    assert max(g.abs().max() for g in got.values()) > 1e-4
