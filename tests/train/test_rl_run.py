"""`gptforge rl` end to end on a tiny random Qwen2: metrics, held-out samples, resume bit for bit,
and bad input in one line."""

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


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory) -> Path:
    """A tiny random Qwen2 with a ChatML BPE tokenizer (as tests/train/test_finetune.py)."""
    from transformers import Qwen2Config

    folder = tmp_path_factory.mktemp("hf") / "qwen"
    tok = train_tokenizer(folder, chat_template=CHATML)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=tok.tokenizer.get_vocab_size(), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=128, tie_word_embeddings=True, eos_token_id=tok.eos_id)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> tuple[Path, Path]:
    rng = random.Random(0)
    rows = []
    for i in range(16):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        q = f"{a}+{b}="
        rows.append({"messages": [{"role": "user", "content": q}], "answer": str(a + b)} if i % 2
                    else {"prompt": q, "answer": str(a + b), "id": i})
    folder = tmp_path_factory.mktemp("prompts")
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    return folder / "train.jsonl", folder / "val.jsonl"


# A reward with variance on a random model: the share of digits among the completion's characters.
REWARD_PY = "def digits(prompt, completion, row):\n    return sum(c.isdigit() for c in completion) / max(1, len(completion))\n"
COMMON = ["--rl.samples_per_prompt", "4", "--rl.prompts_per_step", "2", "--rl.max_new_tokens", "6",
          "--train.micro_batch_size", "3", "--train.device", "cpu", "--train.tensorboard", "false",
          "--train.lr", "3e-3", "--quiet"]


def _rl(hf_model, train, out, *extra) -> int:
    return main(["rl", "--from", str(hf_model), "--prompts", str(train), "--out", str(out), *COMMON, *extra])


def test_rl_run_logs_rollout_metrics_and_writes_samples(hf_model, prompts, tmp_path):
    train, val = prompts
    f = tmp_path / "r.py"
    f.write_text(REWARD_PY)
    y = tmp_path / "rewards.yaml"
    y.write_text(f"rewards:\n  - reward: python:{f}:digits\n  - reward: exact\n    weight: 2\n")
    run = tmp_path / "run"
    assert _rl(hf_model, train, run, "--rl.rewards", str(y), "--rl.eval_prompts", str(val), "--rl.updates_per_batch",
               "2", "--rl.kl_beta", "0.1", "--train.max_steps", "4", "--train.eval_interval", "2") == 0
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for key in ("rl/reward_mean", "rl/reward_std", "rl/zero_variance_share", "rl/completion_length_mean",
                "rl/completion_length_max", "rl/completion_cut_share", "rl/clip_low", "rl/clip_high", "rl/kl",
                "rl/entropy", f"rl/reward/python:{f}:digits", "rl/reward/exact", "tokens_per_second"):
        assert key in rows[0], key
    assert rows[0]["rl/sampling_seconds"] > 0 and rows[1]["rl/sampling_seconds"] == 0  # batch 0 serves steps 1-2
    assert rows[0]["rl/reward_std"] > 0 and abs(rows[0]["rl/ratio"] - 1) < 1e-4  # fresh batch: ratio 1
    assert abs(rows[1]["rl/ratio"] - 1) > 1e-5  # second update on the same rollouts: the policy moved
    assert rows[0]["rl/kl"] < 1e-6 < rows[1]["rl/kl"]  # the reference is the start
    samples = [json.loads(x) for x in (run / "samples" / "step_4.jsonl").read_text().splitlines()]
    assert len(samples) == 3 and set(samples[0]["rewards"]) == {f"python:{f}:digits", "exact"}
    assert rows[3]["eval/pass@1"] == pytest.approx(sum(s["reward"] for s in samples) / 3)
    assert rows[3]["val_loss"] == pytest.approx(-rows[3]["eval/pass@1"])
    doc = (run / "config.yaml").read_text()
    assert "rl:" in doc and "rl_data:" in doc and "samples_per_prompt: 4" in doc


def test_rl_resume_continues_bit_for_bit(hf_model, prompts, tmp_path):
    """Killed after step 3 (in the middle of a rollout batch of 2 updates) and resumed: the same
    losses and rollout metrics as the uninterrupted run."""
    train, _ = prompts
    f = tmp_path / "r.py"
    f.write_text(REWARD_PY)
    args = ("--reward", f"python:{f}:digits", "--rl.updates_per_batch", "2", "--train.checkpoint_interval", "1")
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert _rl(hf_model, train, whole, *args, "--train.max_steps", "5") == 0
    assert _rl(hf_model, train, part, *args, "--train.max_steps", "3") == 0
    assert main(["rl", "--out", str(part), "--resume", "--train.max_steps", "5", "--quiet"]) == 0
    a, b = read_metrics(whole), read_metrics(part)
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5]
    for ra, rb in zip(a, b, strict=True):
        for key in ("loss", "rl/reward_mean", "rl/ratio", "rl/clip_high", "rl/entropy", "rl/completion_length_mean"):
            assert ra[key] == rb[key], (ra["step"], key)
    assert any(r["loss"] != 0 for r in a)


@pytest.mark.parametrize("extra, message, code", [
    # A bad command line exits 2 (errors.USAGE_EXIT), bad input files 1.
    (["--reward", "exact", "--rl.samples_per_prompt", "1"], "rl.samples_per_prompt=1: group advantages", 2),
    (["--reward", "exact", "--rl.samples_per_prompt", "0"], "rl.samples_per_prompt=0: must be", 2),
    (["--reward", "exact", "--rl.max_new_tokens", "5000"], "leaves no room for a prompt", 2),
    (["--reward", "python:missing.py:f"], "no such file missing.py", 1),
    ([], "give one of --reward SPEC", 2),
    (["--reward", "exact", "--parallel.dp_shard", "2", "--parallel.dp_replicate", "1"], "FSDP2, tensor and pipeline", 2),
    (["--reward", "exact", "--train.best_metric", "eval/pass@1"], "train.best_metric='eval/pass@1'", None),
])
def test_bad_input_is_one_line(hf_model, prompts, tmp_path, capsys, extra, message, code):
    train, _ = prompts
    got = _rl(hf_model, train, tmp_path / "run", "--train.max_steps", "1", *extra)
    err = capsys.readouterr().err.strip()
    assert got != 0 and len(err.splitlines()) == 1, err
    assert code is None or got == code, (got, err)
    if message is not None:
        assert message in err, err


def test_a_missing_prompts_file_is_named_first(hf_model, tmp_path, capsys):
    # The default max_new_tokens (256) does not fit this model's context either: the file is said first.
    code = main(["rl", "--from", str(hf_model), "--prompts", str(tmp_path / "none.jsonl"), "--reward", "exact",
                 "--out", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and "none.jsonl: no such file" in err and "'answer'" in err, err


def test_reward_that_raises_names_row_and_function(hf_model, prompts, tmp_path, capsys):
    train, _ = prompts
    f = tmp_path / "r.py"
    f.write_text("def bad(prompt, completion, row):\n    return row['missing']\n")
    assert _rl(hf_model, train, tmp_path / "run", "--reward", f"python:{f}:bad", "--train.max_steps", "1") != 0
    err = capsys.readouterr().err
    assert "train.jsonl:" in err and f"reward python:{f}:bad raised KeyError" in err, err


def test_two_gloo_ranks_match_one_process_and_resume(hf_model, prompts, tmp_path):
    """DDP over 2 gloo ranks: the same completions, rewards and losses as one process (each group is
    sampled with one batch shape and seed on whichever rank holds it), and a resume in the middle of
    a rollout batch continues as the uninterrupted 2-rank run."""
    from tests.train.dist_harness import run_layouts

    train, _ = prompts
    f = tmp_path / "r.py"
    f.write_text(REWARD_PY)
    args = ["rl", "--from", str(hf_model), "--prompts", str(train), *COMMON, "--reward", f"python:{f}:digits",
            "--rl.updates_per_batch", "2", "--train.checkpoint_interval", "1"]
    one = tmp_path / "one"
    assert main([*args, "--out", str(one), "--train.max_steps", "4"]) == 0
    jobs = [{"name": "whole", "argv": [*args, "--out", str(tmp_path / "w"), "--train.max_steps", "4"],
             "run_dir": str(tmp_path / "w")},
            {"name": "part", "argv": [*args, "--out", str(tmp_path / "p"), "--train.max_steps", "3"],
             "run_dir": str(tmp_path / "p")},
            {"name": "resumed", "argv": ["rl", "--out", str(tmp_path / "p"), "--resume", "--train.max_steps", "4",
                                         "--quiet"], "run_dir": str(tmp_path / "p")}]
    res = run_layouts(2, jobs, tmp_path / "dist")
    for name in ("whole", "part", "resumed"):
        assert "error" not in res[name], res[name].get("error")
    single, whole, resumed = read_metrics(one), res["whole"]["rows"], res["resumed"]["rows"]
    for a, b in zip(single, whole, strict=True):
        for key in ("loss", "rl/reward_mean", "rl/reward_std", "rl/completion_length_mean", "rl/completion_length_max",
                    "rl/ratio", "rl/entropy"):
            assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(a[key])), (a["step"], key, a[key], b[key])
    for a, b in zip(whole, resumed, strict=True):
        assert a["loss"] == b["loss"] and a["rl/reward_mean"] == b["rl/reward_mean"], a["step"]


def test_docs_worked_example(hf_model, prompts, tmp_path):
    """docs/rl.md's worked example, run as written with a tiny model and small flags appended."""
    import re
    import shlex

    text = (Path(__file__).resolve().parents[2] / "docs" / "rl.md").read_text()
    block = next(b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "gptforge rl" in b)
    argv = shlex.split(block.replace("\\\n", " "))
    assert argv[:2] == ["gptforge", "rl"]
    train, val = prompts
    names = {"sft_run": str(hf_model), "train.jsonl": str(train), "val.jsonl": str(val), "rl_run": str(tmp_path / "rl")}
    argv = [names.get(a, a) for a in argv[1:]]
    small = ["--rl.samples_per_prompt", "2", "--rl.prompts_per_step", "2", "--rl.max_new_tokens", "4",
             "--train.max_steps", "2", "--train.eval_interval", "2", "--train.device", "cpu",
             "--train.tensorboard", "false", "--quiet"]
    assert main(argv + small) == 0
    rows = read_metrics(tmp_path / "rl")
    assert len(rows) == 2 and "eval/pass@1" in rows[-1] and (tmp_path / "rl" / "samples" / "step_2.jsonl").is_file()


def test_lora_run_with_kl_to_the_base(hf_model, prompts, tmp_path):
    """LoRA: the KL reference is the base with adapters off (no second copy); B starts at 0, so the
    first step's KL is 0, and the adapters move the policy on the second update of the batch."""
    train, _ = prompts
    f = tmp_path / "r.py"
    f.write_text(REWARD_PY)
    run = tmp_path / "run"
    assert _rl(hf_model, train, run, "--reward", f"python:{f}:digits", "--finetune.method", "lora",
               "--rl.kl_beta", "0.1", "--rl.updates_per_batch", "2", "--train.lr", "5e-2",
               "--train.max_steps", "2") == 0
    rows = read_metrics(run)
    assert rows[0]["rl/kl"] == 0.0 and rows[1]["rl/kl"] > 0
    assert "method: lora" in (run / "config.yaml").read_text()


def test_best_checkpoint_by_heldout_pass_at_1(hf_model, prompts, tmp_path):
    """train.best_metric eval/pass@1: the best checkpoint holds the highest held-out reward (higher is
    better, unlike val_loss); without rl.eval_prompts the name is refused (test_bad_input_is_one_line)."""
    from gptforge.runtime import checkpoint as ck

    train, val = prompts
    f = tmp_path / "r.py"
    f.write_text(REWARD_PY)
    run = tmp_path / "run"
    assert _rl(hf_model, train, run, "--reward", f"python:{f}:digits", "--rl.eval_prompts", str(val),
               "--train.best_metric", "eval/pass@1", "--train.eval_interval", "1", "--train.max_steps", "3",
               "--train.lr", "3e-2") == 0
    rows = read_metrics(run)
    best = ck.load_trainer_state(ck.find_checkpoint(run, "best"))
    assert best["best_metric"] == "eval/pass@1"
    assert best["best_metric_value"] == max(r["eval/pass@1"] for r in rows[: best["step"]])
    assert best["best_metric_value"] == rows[best["step"] - 1]["eval/pass@1"]


def test_memory_prediction_counts_the_sampling_kv_cache(hf_model, prompts, tmp_path):
    """The planner's prediction of an RL run adds one group's KV cache: G rows of (longest prompt +
    max_new_tokens) positions x 2 (keys, values) x layers x kv heads x head dim x 4 bytes (fp32
    weights); doubling G adds exactly that much again (nothing else in the step depends on G)."""
    from gptforge.eval.prompts import read_prompts
    from gptforge.train.workflows.finetune import load_chat_tokenizer

    train, _ = prompts
    f = tmp_path / "r.py"
    f.write_text(REWARD_PY)
    predicted = {}
    for G in (4, 8):
        run = tmp_path / f"g{G}"
        assert _rl(hf_model, train, run, "--reward", f"python:{f}:digits", "--rl.samples_per_prompt", str(G),
                   "--train.max_steps", "1") == 0
        predicted[G] = read_metrics(run)[0]["predicted_memory_bytes"]
    longest = max(len(p.ids) for p in read_prompts(train, load_chat_tokenizer(hf_model)))
    # Qwen2 of the fixture: 2 layers, 2 kv heads of 32 / 4 = 8 dims; COMMON's max_new_tokens 6.
    assert predicted[8] - predicted[4] == 2 * 2 * 4 * 2 * (longest + 6) * 8 * 4
