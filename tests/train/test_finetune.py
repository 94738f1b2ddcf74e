"""`gptforge finetune`: instruction fine-tuning, LoRA -> PEFT adapter / merged HF export, resume,
continued pretraining from a Hugging Face checkpoint. Tiny models built with transformers' config
classes; no hub."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from gptforge.cli import main  # noqa: E402
from gptforge.train.loggers import read_metrics  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from test_instruct import CHATML, train_tokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _rows(n: int, seed: int = 0) -> list[dict]:
    """Generated instructions: reverse / repeat a short word (chat and prompt/completion rows)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        word = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 5)))
        task = rng.choice(["reverse", "repeat"])
        answer = word[::-1] if task == "reverse" else word + " " + word
        if i % 3 == 0:
            rows.append({"prompt": f"{task}: {word}\n", "completion": answer})
        else:
            rows.append({"messages": [{"role": "user", "content": f"{task} {word}"},
                                      {"role": "assistant", "content": answer}]})
    return rows


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory) -> Path:
    """A tiny random Qwen2 (GQA, q/k/v biases, tied embeddings) with a ChatML BPE tokenizer."""
    from transformers import Qwen2Config

    folder = tmp_path_factory.mktemp("hf") / "qwen"
    tok = train_tokenizer(folder, chat_template=CHATML)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=tok.tokenizer.get_vocab_size(), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, tie_word_embeddings=True, eos_token_id=tok.eos_id)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": tok.eos_id, "temperature": 0.6}))
    return folder


@pytest.fixture(scope="module")
def instructions(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows(120)))
    return path


COMMON = ["--train.micro_batch_size", "4", "--finetune.block_size", "64", "--train.tensorboard", "false",
          "--train.device", "cpu", "--train.warmup_steps", "2", "--quiet"]


def _finetune(src, data, out, *extra) -> int:
    return main(["finetune", "--from", str(src), "--data", str(data), "--out", str(out), *COMMON, *extra])


def test_full_instruction_finetune_drives_completion_loss_down(hf_model, instructions, tmp_path):
    run = tmp_path / "run"
    assert _finetune(hf_model, instructions, run, "--finetune.method", "full", "--train.max_steps", "30",
                     "--train.lr", "1e-2", "--train.eval_interval", "10", "--finetune.val_fraction", "0.1") == 0
    rows = read_metrics(run)
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    assert len(rows) == 30 and len(val) == 3
    # Completion loss on held-out examples, from about ln(vocab) at step 1.
    assert val[-1] < val[0] and val[-1] < rows[0]["loss"] - 2.0, (rows[0]["loss"], val)
    assert sum(r["loss"] for r in rows[-5:]) / 5 < rows[0]["loss"] - 2.0
    doc = (run / "config.yaml").read_text()
    assert "finetune:" in doc and "method: full" in doc and "base_model:" in doc
    for name in ("tokenizer.json", "tokenizer_config.json", "hf_config.json", "generation_config.json"):
        assert (run / name).is_file(), name
    assert not (run / "adapter").exists()
    # The exported folder is a Qwen2 model that keeps the generation config.
    out = tmp_path / "hf"
    assert main(["convert", "--to-hf", str(run), "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen2"
    assert json.loads((out / "generation_config.json").read_text())["temperature"] == 0.6


def test_lora_cli_export_equals_base_plus_peft_adapter(hf_model, instructions, tmp_path, capsys):
    peft = pytest.importorskip("peft")
    run = tmp_path / "run"
    assert _finetune(hf_model, instructions, run, "--train.max_steps", "6", "--train.lr", "5e-2",
                     "--finetune.lora_target_modules", '["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]',
                     "--finetune.lora_rank", "4", "--finetune.lora_alpha", "8", "--train.eval_interval", "0") == 0
    assert (run / "adapter" / "adapter_config.json").is_file()
    step = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    assert (step / "adapter" / "adapter_model.safetensors").is_file()
    out = tmp_path / "merged"
    assert main(["convert", "--to-hf", str(run), "--out", str(out)]) == 0

    idx = torch.randint(0, 400, (2, 24))
    base = transformers.AutoModelForCausalLM.from_pretrained(hf_model).eval()
    with torch.no_grad():
        plain = base(idx).logits
        adapted = peft.PeftModel.from_pretrained(base, run / "adapter").eval()(idx).logits
        merged = transformers.AutoModelForCausalLM.from_pretrained(out).eval()(idx).logits
    assert (adapted - plain).abs().max() > 1e-3  # training moved the adapters
    assert (merged - adapted).abs().max() < 1e-4
    assert type(transformers.AutoModelForCausalLM.from_pretrained(out)).__name__ == "Qwen2ForCausalLM"
    assert transformers.AutoTokenizer.from_pretrained(out).chat_template == CHATML
    # generate works on the run (the tokenizer's end-of-text token comes from its config).
    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", "reverse abc", "--chat", "--temperature", "0",
                 "--max-new-tokens", "5", "--device", "cpu"]) == 0


def test_lora_resume_is_bit_exact(hf_model, instructions, tmp_path):
    args = ["--train.max_steps", "8", "--train.lr", "1e-2", "--finetune.lora_dropout", "0.1",
            "--train.eval_interval", "4", "--finetune.packing", "padded"]
    assert _finetune(hf_model, instructions, tmp_path / "full", *args) == 0
    assert _finetune(hf_model, instructions, tmp_path / "part", *args, "--train.stop_at_step", "4") == 0
    assert main(["finetune", "--data", str(instructions), "--out", str(tmp_path / "part"), "--resume",
                 "--train.stop_at_step", "0", "--quiet"]) == 0
    a, b = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "part")
    assert [r["loss"] for r in a] == [r["loss"] for r in b] and len(a) == 8
    assert [r.get("val_loss") for r in a] == [r.get("val_loss") for r in b]
    from safetensors.torch import load_file

    ta = load_file(tmp_path / "full" / "adapter" / "adapter_model.safetensors")
    tb = load_file(tmp_path / "part" / "adapter" / "adapter_model.safetensors")
    assert set(ta) == set(tb) and all(torch.equal(ta[k], tb[k]) for k in ta)


def test_continued_pretraining_on_shards_from_hf(hf_model, tmp_path):
    from tests.conftest import stdlib_sample_files

    shards = tmp_path / "shards"
    files = [str(p) for p in stdlib_sample_files(6)]
    assert main(["prepare", *files, "--out", str(shards), "--tokenizer", str(hf_model / "tokenizer.json"),
                 "--workers", "1", "--val-fraction", "0.2"]) == 0
    run = tmp_path / "run"
    assert _finetune(hf_model, shards, run, "--finetune.method", "full", "--train.max_steps", "12",
                     "--train.lr", "1e-2", "--train.eval_interval", "6", "--train.eval_steps", "2") == 0
    rows = read_metrics(run)
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    assert len(val) == 2 and val[1] < val[0]
    assert "meta_sha256" in (run / "config.yaml").read_text()
    # Shards of another tokenizer are refused, naming the fix.
    meta = json.loads((shards / "meta.json").read_text())
    meta["tokenizer_sha256"] = "0" * 64
    (shards / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="--tokenizer"):
        from gptforge.config import FinetuneConfig, RunConfig
        from gptforge.train.workflows.finetune import finetune as run_finetune

        run_finetune(FinetuneConfig(method="full"), RunConfig(), hf_model, shards, tmp_path / "other")


def test_errors_name_the_problem(hf_model, instructions, tmp_path, capsys, monkeypatch):
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "bitsandbytes", None)  # as if not installed
        assert _finetune(hf_model, instructions, tmp_path / "q", "--finetune.method", "qlora") == 1
    err = capsys.readouterr().err
    assert "qlora" in err and "bitsandbytes" in err and "gptforge[qlora]" in err and "--finetune.method lora" in err
    assert _finetune(hf_model, instructions, tmp_path / "q", "--finetune.method", "qlora",
                     "--parallel.tp", "2") == 1
    assert "single process" in capsys.readouterr().err
    assert _finetune(hf_model, tmp_path / "missing.jsonl", tmp_path / "r") == 1
    assert "missing.jsonl" in capsys.readouterr().err
    assert _finetune(hf_model, instructions, tmp_path / "r", "--finetune.lora_target_modules", '["qkv"]') == 1
    assert "lora.target_modules" in capsys.readouterr().err
    assert _finetune(hf_model, instructions, tmp_path / "r", "--finetune.chat_template", str(tmp_path / "t.jinja")) == 1
    assert "t.jinja" in capsys.readouterr().err
    assert _finetune(hf_model, instructions, tmp_path / "r", "--finetune.block_size", "100000") == 1
    assert "finetune.block_size" in capsys.readouterr().err


def test_defaults_are_size_aware_and_warmup_fits_a_short_run(hf_model, instructions, tmp_path):
    """issue 41 item 5: `--train.max_steps 5` alone ran into a fixed warmup of 20; lr and warmup
    are now resolved per method and model width (gptforge.train.optim.finetune_lr)."""
    import yaml

    from gptforge.train.optim import default_lr, finetune_lr

    assert finetune_lr("lora", 64) == default_lr(64, 0) and finetune_lr("qlora", 4096) == default_lr(4096, 0)
    assert finetune_lr("full", 768) == pytest.approx(default_lr(768, 0) / 10)
    for method in ("lora", "full"):
        run = tmp_path / method
        args = ["finetune", "--from", str(hf_model), "--data", str(instructions), "--out", str(run),
                "--train.micro_batch_size", "4", "--finetune.block_size", "64", "--train.tensorboard", "false",
                "--train.device", "cpu", "--quiet", "--finetune.method", method, "--train.max_steps", "5"]
        assert main(args) == 0
        train = yaml.safe_load((run / "config.yaml").read_text())["train"]
        assert train["warmup_steps"] <= 5 // 4 + 1
        assert train["lr"] == pytest.approx(finetune_lr(method, 32))
        assert train["min_lr"] == pytest.approx(train["lr"] / 10)


def test_resume_onto_other_instruction_data_is_refused_naming_both_hashes(hf_model, instructions, tmp_path, capsys):
    import hashlib

    run = tmp_path / "run"
    assert _finetune(hf_model, instructions, run, "--train.max_steps", "4", "--train.stop_at_step", "2") == 0
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps(r) + "\n" for r in _rows(120, seed=1)))
    capsys.readouterr()
    assert main(["finetune", "--data", str(other), "--out", str(run), "--resume", "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--resume" in err[0] and "other.jsonl" in err[0]
    for path in (instructions, other):
        assert hashlib.sha256(path.read_bytes()).hexdigest()[:12] in err[0]
    assert len(read_metrics(run)) == 2  # nothing trained on the other data
