"""docs/extending.md's example, run: a new objective and a new batch source, defined here, trained
through the real entry point (`gptforge.train.run.train`) with nothing else changed.

The data follows two rules: after a token at an even position comes (x + 1) mod V, after one at
an odd position (5 x + 3) mod V. The objective counts the loss at even positions only, so the
model learns the first rule and not the second: the even-position loss falls towards 0 while the
odd-position loss, which no gradient reaches, stays far above it.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.runtime.loss import IGNORE_INDEX, token_loss_sum
from gptforge.train.objectives import Forward, ObjectiveBase, ObjectiveLoss
from gptforge.train.run import train
from gptforge.train.sources import BatchesBase, SourceBase

V, T = 16, 16


def rule_rows(n: int, seed: int) -> torch.Tensor:
    """n rows of T + 1 tokens following the even/odd rules from a random first token: (n, T + 1) int64."""
    rng = np.random.Generator(np.random.Philox(key=seed))
    rows = np.zeros((n, T + 1), dtype=np.int64)
    rows[:, 0] = rng.integers(0, V, size=n)
    for t in range(T):
        rows[:, t + 1] = (rows[:, t] + 1) % V if t % 2 == 0 else (5 * rows[:, t] + 3) % V
    return torch.from_numpy(rows)


def even_only(targets: torch.Tensor) -> torch.Tensor:
    """targets (b, T) with those at odd positions set to -100."""
    out = targets.clone()
    out[:, 1::2] = IGNORE_INDEX
    return out


class EvenPositions(ObjectiveBase):
    """Next-token loss at even positions only; unit: even-position targets. Metric: the share of
    even positions whose argmax prediction is right."""

    name = "even-position loss"
    unit = "tokens"
    metric_names = ("even/accuracy",)

    def __init__(self):
        self.micro_batches_seen = 0

    def count(self, micro_batch) -> int:
        return int((even_only(micro_batch[1]) != IGNORE_INDEX).sum())

    def loss(self, forward: Forward, micro_batch) -> ObjectiveLoss:
        x, y = micro_batch
        logits = forward(x)
        y = even_only(y)
        keep = y != IGNORE_INDEX
        right = (logits.argmax(-1) == y) & keep
        self.micro_batches_seen += 1
        return ObjectiveLoss(token_loss_sum(logits, y), {"even/accuracy": (float(right.sum()), float(keep.sum()))})

    def state_dict(self) -> dict:
        return {"micro_batches_seen": self.micro_batches_seen}

    def load_state_dict(self, state: dict) -> None:
        self.micro_batches_seen = state["micro_batches_seen"]


class RuleBatches(BatchesBase):
    def __init__(self, tc, dp_rank: int):
        self.mbs, self.accumulation, self.seed, self.dp_rank = (tc.micro_batch_size, tc.gradient_accumulation_steps,
                                                                tc.seed, dp_rank)
        self.seq_len = T
        self.global_batch_size = tc.micro_batch_size * tc.gradient_accumulation_steps
        self.tokens_per_step = self.global_batch_size * T

    def micro_batches(self, step: int) -> list:
        rows = rule_rows(self.mbs * self.accumulation, seed=self.seed * 100_003 + step)
        return [(r[:, :-1].contiguous(), r[:, 1:].contiguous()) for r in rows.split(self.mbs)]


class RuleSource(SourceBase):
    """Generated rows of the two rules; validation reports the even and the odd loss."""

    def __init__(self):
        self.vocab_size, self.tokenizer_file, self.has_val = V, None, True
        self.description = f"generated rows of {T + 1} tokens, vocabulary {V} (even/odd rules)"
        self.val = rule_rows(64, seed=999)
        self.last: dict[str, float] = {}

    def batches(self, block_size, tc, dp_rank, dp_size):
        return RuleBatches(tc, dp_rank)

    @torch.no_grad()
    def evaluate(self, model, device, precision, should_stop=None):
        was = model.training
        model.eval()
        logits = model(self.val[:, :-1].to(device)).float()
        model.train(was)
        y = self.val[:, 1:].to(device)
        odd = y.clone()
        odd[:, 0::2] = IGNORE_INDEX
        n_even, n_odd = int((even_only(y) != IGNORE_INDEX).sum()), int((odd != IGNORE_INDEX).sum())
        self.last = {"val/even_loss": float(token_loss_sum(logits, even_only(y))) / n_even,
                     "val/odd_loss": float(token_loss_sum(logits, odd)) / n_odd}
        return self.last["val/even_loss"]

    def val_metrics(self) -> dict[str, float]:
        return self.last

    def provenance(self) -> dict:
        return {"path": "generated", "rules": "even: x+1 mod V; odd: 5x+3 mod V"}

    def check_resume(self, saved, checkpoint) -> None:
        return None


def test_a_toy_objective_and_source_train_through_the_real_entry_point(tmp_path, one_thread):
    cfg = RunConfig(model=ModelConfig(arch="gpt2", n_layer=2, n_head=2, d_model=32, block_size=T, dropout=0.0),
                    train=TrainConfig(max_steps=60, micro_batch_size=16, gradient_accumulation_steps=2, lr=1e-2,
                                      warmup_steps=5, eval_interval=20, checkpoint_interval=60, tensorboard=False,
                                      report=False, precision="fp32", device="cpu", seed=3))
    objective = EvenPositions()
    res = train(cfg, tmp_path / "unused", tmp_path / "run", progress=False, data=RuleSource(), objective=objective)
    rows = res.history
    assert res.step == 60 and rows[-1]["tokens_seen"] == 60 * 32 * T
    # The objective's unit and metric reach every row: its loss at the start is about ln V.
    assert abs(rows[0]["loss"] - math.log(V)) < 0.5
    assert rows[-1]["even/accuracy"] > 0.9 > rows[0]["even/accuracy"]
    evals = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in evals] == [20, 40, 60]
    last = evals[-1]
    assert last["val_loss"] == last["val/even_loss"] < 0.3
    # Odd positions never enter the loss: the model did not learn their rule.
    assert last["val/odd_loss"] > 1.5 and last["val/odd_loss"] > 5 * last["val/even_loss"]
    # The objective's state rides in the checkpoint (gptforge.train.state).
    state = torch.load(tmp_path / "run" / "checkpoints" / "step_0000060" / "trainer_state.pt", weights_only=False)
    assert state["objective"] == {"micro_batches_seen": 120}
