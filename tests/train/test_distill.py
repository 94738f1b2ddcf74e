import math

import pytest
import torch
import torch.nn.functional as F

from gptforge.config import ModelConfig
from gptforge.errors import InputError
from gptforge.model.gpt import GPT
from gptforge.train.objectives.distill import distill_loss, distill_loss_sum
from gptforge.train.workflows.distill import Teacher, check_same_tokenizer


def _model(seed=0):
    torch.manual_seed(seed)
    return GPT(ModelConfig(preset="gpt2-nano", vocab_size=97, block_size=16).resolved())


def test_teacher_equal_to_student_gives_zero_kl():
    student = _model()
    teacher = Teacher(_model())  # same seed: the student's initial weights
    x = torch.randint(0, 97, (2, 16))
    y = torch.randint(0, 97, (2, 16))
    s = student(x)
    terms = distill_loss_sum(s, teacher(x), y, alpha=1.0, temperature=1.0)
    assert float(terms.kl.detach()) == pytest.approx(0.0, abs=1e-5)
    # alpha=1: what is left is the plain cross-entropy.
    assert float(terms.loss.detach()) == pytest.approx(float(F.cross_entropy(s.detach().reshape(-1, 97), y.reshape(-1), reduction="sum")),
                                              rel=1e-5)


def test_loss_matches_hinton_formula_and_ignores_masked_tokens():
    torch.manual_seed(1)
    s, t = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    y = torch.tensor([[1, -100, 2], [0, 4, -100]])
    T, alpha = 2.0, 0.5
    keep = y.reshape(-1) != -100
    ps = F.softmax(s.reshape(-1, 5)[keep] / T, -1)
    pt = F.softmax(t.reshape(-1, 5)[keep] / T, -1)
    kl = (pt * (pt.log() - ps.log())).sum()
    ce = F.cross_entropy(s.reshape(-1, 5), y.reshape(-1), ignore_index=-100, reduction="sum")
    want = (T * T * kl + alpha * ce) / 4
    assert float(distill_loss(s, t, y, alpha, T)) == pytest.approx(float(want), rel=1e-5)
    assert distill_loss_sum(s, t, y, alpha, T).tokens == 4


def test_student_learns_the_teacher_and_teacher_is_frozen():
    teacher = Teacher(_model(0))
    student = _model(1)
    opt = torch.optim.AdamW(student.parameters(), lr=3e-3)
    x = torch.randint(0, 97, (4, 16))
    first = None
    for _ in range(15):
        terms = distill_loss_sum(student(x), teacher(x), x, alpha=0.0, temperature=2.0)
        (terms.loss / terms.tokens).backward()
        opt.step()
        opt.zero_grad()
        first = first if first is not None else float(terms.kl.detach())
    assert float(terms.kl.detach()) < 0.5 * first
    assert all(p.grad is None and not p.requires_grad for p in teacher.model.parameters())
    assert not teacher.model.training and not teacher(x).requires_grad


def test_vocabulary_or_tokenizer_mismatch_is_named():
    with pytest.raises(InputError, match="--teacher.*97.*128"):
        check_same_tokenizer(97, None, 128, None)
    with pytest.raises(InputError, match="another tokenizer"):
        check_same_tokenizer(97, "a" * 64, 97, "b" * 64)
    check_same_tokenizer(97, "a" * 64, 97, None)  # unknown on one side: only the size is checked
    with pytest.raises(InputError, match="same vocabulary"):
        distill_loss(torch.zeros(1, 2, 5), torch.zeros(1, 2, 6), torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(InputError, match="temperature"):
        distill_loss(torch.zeros(1, 2, 5), torch.zeros(1, 2, 5), torch.zeros(1, 2, dtype=torch.long), temperature=0)
    assert math.isfinite(float(distill_loss(torch.zeros(1, 2, 5), torch.zeros(1, 2, 5),
                                            torch.zeros(1, 2, dtype=torch.long))))


def test_teacher_loads_a_run_in_another_dtype(tmp_path, tiny_shards):
    from tests.export.conftest import train_tiny

    run = train_tiny(tiny_shards, tmp_path / "t", "gpt2", steps=2)
    teacher = Teacher.load(run, dtype=torch.bfloat16)
    assert teacher.model.wte.weight.dtype == torch.bfloat16 and teacher.tokenizer_sha256
    from gptforge.data.shards import load_meta

    teacher.check_student(teacher.vocab_size, load_meta(tiny_shards)["tokenizer_sha256"])
    assert teacher(torch.zeros(1, 4, dtype=torch.long)).dtype == torch.bfloat16
