"""gptforge's preference tokenisation, log-probs and losses against TRL 1.16 (the reference).

A tiny Qwen2- and Llama-shaped Hugging Face model and 16 rows of each of TRL's formats are made in
the test. TRL's DPOTrainer tokenises and runs the HF model; gptforge tokenises with
`gptforge.data.preference` and runs the converted GPT. Checked: the token ids of every row, per-row
first-step `logps/chosen` / `logps/rejected` (1e-4, fp32), and loss and rewards after two AdamW
steps on the same batches (1e-4) for sigmoid and ipo; ORPO and SimPO against TRL's experimental
trainers at step one on their own tokenisation.
"""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch

pytest.importorskip("transformers")
trl = pytest.importorskip("trl")  # in the test extra: .ci/run installs it, so this never skips there

from gptforge.data.chat import ChatTokenizer  # noqa: E402
from gptforge.data.preference import PairDataset, PairExample, tokenize_pair  # noqa: E402
from gptforge.runtime.loading import load_pretrained  # noqa: E402
from gptforge.runtime.preference import PreferenceLoss, pair_logps  # noqa: E402
from tests.preference_fixtures import (  # noqa: E402
    conversational_rows,
    implicit_rows,
    plain_rows,
    write_hf_model,
)

FORMATS = {"plain": plain_rows, "conversational": conversational_rows, "implicit": implicit_rows}
LR = 3e-3


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def hf_folder(request, tmp_path_factory):
    return write_hf_model(tmp_path_factory.mktemp(request.param), request.param)


def _hf(folder):
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    # PreTrainedTokenizerFast keeps tokenizer.json as written; transformers 5's AutoTokenizer would
    # rebuild a Qwen2 tokenizer's pre-tokenizer from its class instead of the file.
    tok = PreTrainedTokenizerFast.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model, tok


def _dpo_trainer(folder, rows, tmp_path, loss_type="sigmoid", max_steps=1, beta=0.1):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    model, tok = _hf(folder)
    # bf16=False: TRL's configs default to bf16 autocast (on the CPU too); the check is in fp32.
    args = DPOConfig(output_dir=str(tmp_path / "trl"), report_to=[], use_cpu=True, bf16=False, max_length=None,
                     beta=beta, loss_type=loss_type, per_device_train_batch_size=len(rows),
                     gradient_accumulation_steps=1,
                     max_steps=max_steps, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
                     weight_decay=0.0, optim="adamw_torch", max_grad_norm=1.0, logging_steps=1, save_strategy="no",
                     seed=0, dataloader_num_workers=0, disable_tqdm=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return DPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)


def _ours(folder, rows) -> tuple[torch.nn.Module, PairDataset]:
    tok = ChatTokenizer.from_dir(folder)
    model, _ = load_pretrained(folder, dtype=torch.float32)
    examples = [tokenize_pair(tok, r, f"row {i}") for i, r in enumerate(rows)]
    return model, PairDataset(examples, pad_id=tok.eos_id)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_tokens_and_first_step_logps_equal_trl(hf_folder, fmt, tmp_path):
    rows = FORMATS[fmt]()
    trainer = _dpo_trainer(hf_folder, rows, tmp_path)
    ours_model, ds = _ours(hf_folder, rows)
    for i, ex in enumerate(trainer.train_dataset):
        mine = ds.examples[i]
        assert (mine.prompt_ids, mine.chosen_ids, mine.rejected_ids) == \
            (ex["prompt_ids"], ex["chosen_ids"], ex["rejected_ids"]), f"{fmt} row {i} tokenised differently"
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(rows))])
    trl_chosen, trl_rejected = trainer.compute_ref_log_probs(trainer.model, batch)
    chosen, rejected = pair_logps(ours_model.eval(), ds.batch(range(len(rows))))
    assert chosen.shape == (16,) and rejected.shape == (16,)
    assert (chosen < 0).all() and not torch.equal(chosen, rejected)
    torch.testing.assert_close(chosen, trl_chosen.float(), atol=1e-4, rtol=0)
    torch.testing.assert_close(rejected, trl_rejected.float(), atol=1e-4, rtol=0)


def _our_two_steps(folder, rows, loss: PreferenceLoss) -> list[dict[str, float]]:
    """Two AdamW steps (lr LR, constant, clip 1.0) of the full 16-pair batch against a frozen copy."""
    model, ds = _ours(folder, rows)
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    logs = []
    batch = ds.batch(range(len(rows)))
    for _ in range(2):
        ref_c, ref_r = pair_logps(ref, batch)
        total, metrics = loss(model(batch["input_ids"]), batch, ref_c, ref_r)
        (total / len(rows)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        logs.append({"loss": float(total) / len(rows), **{k: float(v.mean()) for k, v in metrics.items()}})
    return logs


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_two_steps_equal_trl(hf_folder, loss_type, tmp_path):
    rows = plain_rows()
    trainer = _dpo_trainer(hf_folder, rows, tmp_path, loss_type=loss_type, max_steps=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    trl_logs = [h for h in trainer.state.log_history if "rewards/chosen" in h]
    assert len(trl_logs) == 2
    ours = _our_two_steps(hf_folder, rows, PreferenceLoss(loss_type, beta=0.1))
    if loss_type == "sigmoid":
        assert ours[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert abs(ours[1]["rewards/margins"]) > 1e-3, "step two must move the rewards for the check to mean anything"
    for step in range(2):
        for key in ("loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
                    "logps/chosen", "logps/rejected"):
            assert ours[step][key] == pytest.approx(trl_logs[step][key], abs=1e-4), (step + 1, key)


def _trl_pairs(trainer) -> PairDataset:
    """TRL's own tokenisation (ORPO/CPO's tokenize_row) as gptforge pairs."""
    examples = []
    for ex in trainer.train_dataset:
        p = ex["prompt_input_ids"]
        assert ex["chosen_input_ids"][:len(p)] == p and ex["rejected_input_ids"][:len(p)] == p
        examples.append(PairExample(p, ex["chosen_input_ids"][len(p):], ex["rejected_input_ids"][len(p):]))
    return PairDataset(examples, pad_id=0)  # right padding: what fills it never reaches a counted position


@pytest.mark.parametrize("loss_type", ["orpo", "simpo"])
def test_reference_free_step_one_equals_trl_experimental(hf_folder, loss_type, tmp_path):
    from datasets import Dataset

    rows = plain_rows()
    model, tok = _hf(hf_folder)
    common = dict(output_dir=str(tmp_path / "trl"), report_to=[], use_cpu=True, bf16=False, beta=0.2, max_length=512,
                  per_device_train_batch_size=16, disable_tqdm=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if loss_type == "orpo":
            from trl.experimental.orpo import ORPOConfig, ORPOTrainer

            trainer = ORPOTrainer(model=model, args=ORPOConfig(**common), train_dataset=Dataset.from_list(rows),
                                  processing_class=tok)
        else:
            from trl.experimental.cpo import CPOConfig, CPOTrainer

            trainer = CPOTrainer(model=model, args=CPOConfig(**common, loss_type="simpo", cpo_alpha=0.0,
                                                             simpo_gamma=0.3),
                                 train_dataset=Dataset.from_list(rows), processing_class=tok)
        batch = trainer.data_collator([trainer.train_dataset[i] for i in range(16)])
        trl_loss, trl_metrics = trainer.get_batch_loss_metrics(trainer.model, batch)
    ours_model, _ = _ours(hf_folder, rows)
    ds = _trl_pairs(trainer)
    b = ds.batch(range(16))
    total, metrics = PreferenceLoss(loss_type, beta=0.2, simpo_gamma=0.3)(ours_model(b["input_ids"]), b)
    assert float(total) / 16 == pytest.approx(float(trl_loss), abs=1e-4)
    for key, v in metrics.items():
        assert float(v.mean()) == pytest.approx(float(trl_metrics[key]), abs=1e-4), key
