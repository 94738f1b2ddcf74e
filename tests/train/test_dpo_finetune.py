"""`gptforge finetune --finetune.objective dpo` end to end on a tiny Qwen2-shaped HF model: TRL's
numbers through the real trainer, the three reference kinds (frozen copy, adapters off, precomputed)
agreeing, resume after a SIGKILL bit for bit, TRL's metric names in metrics.jsonl, validation pairs, evaluate."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import signal
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from gptforge.train.loggers import read_metrics  # noqa: E402
from tests.preference_fixtures import plain_rows, write_hf_model, write_jsonl  # noqa: E402

KEYS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
        "logps/rejected")
LR = 3e-3


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    return write_hf_model(tmp_path_factory.mktemp("qwen2"), "qwen2")


def _finetune(hf, data, out, *extra) -> list[dict]:
    from gptforge.commands.finetune import main

    args = ["--from", str(hf), "--data", str(data), "--out", str(out), "--quiet", "--finetune.objective", "dpo",
            "--finetune.method", "full", "--finetune.val_fraction", "0", "--train.max_steps", "2",
            "--train.micro_batch_size", "16", "--train.lr", str(LR), "--train.lr_schedule", "constant",
            "--train.warmup_steps", "0", "--train.weight_decay", "0", "--train.beta2", "0.999",
            "--train.precision", "fp32", "--train.device", "cpu", "--train.eval_interval", "0",
            "--train.compile", "false", *extra]
    assert main(args) == 0
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"step"' in line]


def _train_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if "rewards/chosen" in r]


def _finetune_and_die(hf, data, out, step: int) -> None:
    """In a forked child: a 3-step precomputed-reference DPO run that SIGKILLs itself (no cleanup
    runs, as with kill -9) once the checkpoint of `step` is complete (its `latest` pointer written)."""
    from gptforge.runtime import checkpoint as ck

    write_text = ck.atomic_write_text

    def write_then_die(path, text, *a, **k):
        written = write_text(path, text, *a, **k)
        if Path(path).name == "latest" and text.strip() == ck.step_dir_name(step):
            os.kill(os.getpid(), signal.SIGKILL)
        return written

    ck.atomic_write_text = write_then_die
    _finetune(hf, data, out, "--train.max_steps", "3", "--finetune.precompute_ref", "true",
              "--train.checkpoint_interval", str(step))


def test_two_steps_through_the_trainer_equal_trl(hf, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    from trl import DPOConfig, DPOTrainer

    rows = plain_rows()
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    ours = _train_rows(_finetune(hf, data, tmp_path / "run"))
    assert len(ours) == 2
    assert ours[0]["loss"] == pytest.approx(math.log(2), abs=1e-6) and ours[0]["rewards/margins"] == 0
    tok = PreTrainedTokenizerFast.from_pretrained(hf)
    args = DPOConfig(output_dir=str(tmp_path / "trl"), report_to=[], use_cpu=True, bf16=False, max_length=None,
                     per_device_train_batch_size=16, max_steps=2, learning_rate=LR, lr_scheduler_type="constant",
                     warmup_steps=0, weight_decay=0.0, optim="adamw_torch", max_grad_norm=1.0, logging_steps=1,
                     save_strategy="no", disable_tqdm=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = DPOTrainer(model=AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32), args=args,
                             train_dataset=Dataset.from_list(rows), processing_class=tok)
        trainer.train()
    trl_rows = [h for h in trainer.state.log_history if "rewards/chosen" in h]
    assert abs(trl_rows[1]["rewards/margins"]) > 1e-3
    for step in range(2):
        for key in ("loss", *KEYS):
            assert ours[step][key] == pytest.approx(trl_rows[step][key], abs=1e-4), (step + 1, key)


def test_reference_kinds_agree_and_resume_is_bit_for_bit(hf, tmp_path):
    data = write_jsonl(tmp_path / "pairs.jsonl", plain_rows())
    copy_rows = _train_rows(_finetune(hf, data, tmp_path / "copy", "--train.max_steps", "3"))
    pre = tmp_path / "pre"
    pre_rows = _train_rows(_finetune(hf, data, pre, "--train.max_steps", "3", "--finetune.precompute_ref", "true"))
    assert (pre / "ref_logps.pt").is_file()
    for a, b in zip(copy_rows, pre_rows, strict=True):
        for key in ("loss", *KEYS):
            assert a[key] == pytest.approx(b[key], abs=1e-6), key
    # SIGKILLed right after the step-2 checkpoint of a 3-step run, resumed: the straight run's numbers.
    cut = tmp_path / "cut"
    child = multiprocessing.get_context("fork").Process(target=_finetune_and_die, args=(hf, data, cut, 2))
    child.start()
    child.join(300)
    assert child.exitcode == -signal.SIGKILL
    assert max(r["step"] for r in _train_rows(read_metrics(cut))) == 2
    (cut / "ref_logps.pt").unlink()  # the table in the checkpoint (or recomputed from --from) serves the resume
    resumed = _train_rows(_finetune(hf, data, cut, "--train.max_steps", "3", "--finetune.precompute_ref", "true",
                                    "--resume"))
    assert resumed[-1]["step"] == pre_rows[-1]["step"]
    for key in ("loss", *KEYS):
        assert resumed[-1][key] == pre_rows[-1][key], key


def test_lora_reference_is_the_base_and_validation_pairs_are_scored(hf, tmp_path, capsys):
    data = write_jsonl(tmp_path / "pairs.jsonl", plain_rows(20))
    run = tmp_path / "lora"
    rows = _finetune(hf, data, run, "--finetune.method", "lora", "--finetune.val_fraction", "0.2",
                     "--train.micro_batch_size", "4", "--train.max_steps", "3", "--train.lr", "0.05",
                     "--train.eval_interval", "3", "--finetune.dpo_loss", "ipo")
    train_rows = _train_rows(rows)
    # Adapters start at B = 0: the policy is the base, so the first step's rewards are exactly 0.
    assert train_rows[0]["rewards/chosen"] == 0 and train_rows[0]["rewards/rejected"] == 0
    assert train_rows[-1]["rewards/margins"] != 0
    val = [r for r in rows if "val/rewards/accuracies" in r]
    assert val and 0 <= val[-1]["val/rewards/accuracies"] <= 1 and math.isfinite(val[-1]["val_loss"])
    assert (run / "adapter" / "adapter_config.json").is_file()
    page = (run / "report.html").read_text()
    assert "chart-preference" in page and "Preference rewards" in page
    assert r"val\u002frewards\u002fmargins" in page  # the held-out pairs plotted (plotly escapes "/")
    # The tuned model exports like any fine-tune: a Qwen2 folder transformers loads, with the chat template.
    from transformers import AutoModelForCausalLM

    from gptforge.cli import main as cli

    assert cli(["convert", "--to-hf", str(run), "--out", str(tmp_path / "exported")]) == 0
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "exported").config.model_type == "qwen2"
    exported = tmp_path / "exported"
    template = (exported / "chat_template.jinja").read_text() if (exported / "chat_template.jinja").is_file() \
        else json.loads((exported / "tokenizer_config.json").read_text()).get("chat_template", "")
    assert "<|im_start|>" in template
    from gptforge.commands.evaluate import main

    capsys.readouterr()  # the fine-tuning's own output
    assert main([str(run), "--tasks", str(data), "--reference", str(hf), "--json", "--quiet"]) == 0
    metrics = json.loads(capsys.readouterr().out)["tasks"]["pairs"]["metrics"]
    assert set(metrics) >= {"pref_acc", "reward_acc", "reward_margin"}


def test_bad_dpo_options_and_data_fail_in_one_line(hf, tmp_path):
    from gptforge.errors import InputError

    data = write_jsonl(tmp_path / "pairs.jsonl", plain_rows(4) + [{"prompt": "p", "chosen": "x", "rejected": "x"}])
    with pytest.raises(InputError, match=r"pairs.jsonl:5: `chosen` and `rejected` are the same"):
        _finetune(hf, data, tmp_path / "bad")
    good = write_jsonl(tmp_path / "good.jsonl", plain_rows(4))
    with pytest.raises(ValueError, match="finetune.rpo_alpha adds an NLL term ORPO already has"):
        _finetune(hf, good, tmp_path / "bad2", "--finetune.dpo_loss", "orpo", "--finetune.rpo_alpha", "1")
    from gptforge.cli import main

    # A bad --finetune.dpo_* value is a bad command line: exit 2 (errors.USAGE_EXIT).
    assert main(["finetune", "--from", str(hf), "--data", str(good), "--out", str(tmp_path / "bad3"), "--quiet",
                 "--finetune.objective", "dpo", "--finetune.dpo_beta", "-1"]) == 2


def test_dpo_objective_has_its_own_lr_and_warmup_defaults(hf, tmp_path):
    """Unset lr/warmup: the DPO rule by width (not SFT's `finetune_lr`, 0.0025 at d_model 32)."""
    import yaml

    from gptforge.commands.finetune import build_parser, main
    from gptforge.options import parse_command
    from gptforge.train.optim import finetune_lr
    from gptforge.train.workflows.preference import dpo_default_lr, dpo_train_defaults

    assert dpo_default_lr(64) == 1e-5 and dpo_default_lr(4096) == 1e-6
    assert 1e-6 < dpo_default_lr(768) < 1e-5 and dpo_default_lr(32) > dpo_default_lr(64)
    _, dpo = parse_command(build_parser(), ["--from", "m", "--data", "d.jsonl", "--out", "o",
                                            "--finetune.objective", "dpo"])
    assert dpo.train.lr is None and dpo.train.warmup_steps is None and dpo.train.min_lr is None
    filled = dpo_train_defaults(dpo.train, 64)
    assert (filled.lr, filled.warmup_steps) == (1e-5, 50) and filled.min_lr == pytest.approx(1e-6)  # 10% of 500 steps
    data = write_jsonl(tmp_path / "pairs.jsonl", plain_rows(8))
    run = tmp_path / "run"
    assert main(["--from", str(hf), "--data", str(data), "--out", str(run), "--quiet", "--finetune.objective", "dpo",
                 "--finetune.method", "full", "--finetune.val_fraction", "0", "--train.max_steps", "3",
                 "--train.micro_batch_size", "4", "--train.precision", "fp32", "--train.device", "cpu",
                 "--train.eval_interval", "0", "--train.compile", "false"]) == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())["train"]
    assert saved["lr"] == dpo_default_lr(32) != finetune_lr("full", 32) and saved["warmup_steps"] == 1
    assert saved["min_lr"] == pytest.approx(saved["lr"] / 10)
