"""`gptforge plan` on the command line: same config keys as pretrain, JSON for machines, clear errors."""

import json

import pytest

from gptforge.cli import main as cli_main
from gptforge.commands.plan import main, parse_tokens


def run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_json_has_fits_param_count_and_named_figures(capsys):
    rc, out, _ = run(capsys, "--model", "gpt2-small", "--train.micro_batch_size", "8", "--train.precision", "bf16",
                     "--gpu", "a100-40g", "--tokens", "10B", "--price", "1.5", "--json")
    assert rc == 0
    d = json.loads(out)
    assert d["fits"] is True and d["param_count"] == 124_439_808
    mem = d["memory"]
    for key in ("weights", "gradients", "optimizer_states", "activations", "activations_per_layer",
                "logits_and_loss", "comm_buckets", "cuda_context", "allocator_margin", "total"):
        assert isinstance(mem[key], int)
    assert d["tokens"] == 10e9 and d["speed"]["cost_high"] > d["speed"]["cost_low"] > 0
    assert d["speed"]["flops_per_token"] > d["speed"]["flops_per_token_6n"]


def test_yaml_recipe_and_dotted_overrides(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model:\n  preset: gpt2-medium\ntrain:\n  micro_batch_size: 2\n  precision: bf16\n"
                      "parallel:\n  zero_stage: 3\n")
    rc, out, _ = run(capsys, "--config", str(recipe), "--train.micro_batch_size", "4", "--num-gpus", "4",
                     "--gpu", "h100-sxm", "--json")
    d = json.loads(out)
    assert rc == 0
    assert d["model"]["n_layer"] == 24 and d["train"]["micro_batch_size"] == 4
    assert d["parallel"]["dp_shard"] == 4 and d["num_gpus"] == 4


def test_human_report(capsys):
    rc, out, _ = run(capsys, "--model", "llama-2-7b", "--train.precision", "bf16", "--train.micro_batch_size", "1",
                     "--gpu", "a100-80g")
    assert rc == 0
    assert "DOES NOT FIT" in out and "logits and loss" in out and "GPU-hours" in out


def test_recommend_prints_recipe_lines(capsys):
    rc, out, _ = run(capsys, "--model", "llama-2-7b", "--train.precision", "bf16", "--train.micro_batch_size", "1",
                     "--gpu", "a100-80g", "--num-gpus", "8", "--recommend", "--top", "2")
    assert rc == 0
    assert "Fastest layouts that fit" in out and "zero_stage:" in out and "\n2. " in out


def test_recommend_with_too_little_host_memory_says_what_an_offload_layout_needs(capsys):
    rc, out, _ = run(capsys, "--model", "llama-2-70b", "--train.precision", "bf16", "--gpu", "a100-80g",
                     "--num-gpus", "2", "--recommend", "--host-memory-gb", "512")
    assert rc == 0
    assert "try --recommend" not in out and "see the layouts ranked below" in out
    assert "within 512 GiB of host memory per node (the least an offload layout needs: " in out
    rc, _, err = run(capsys, "--model", "llama-2-70b", "--gpu", "a100-80g", "--recommend", "--host-memory-gb", "0")
    assert rc == 2 and "--host-memory-gb must be > 0" in err


def test_list_gpus(capsys):
    rc, out, _ = run(capsys, "--list-gpus")
    assert rc == 0
    for name in ("v100-16g", "h100-sxm", "mi300x", "rtx4090"):
        assert name in out


@pytest.mark.parametrize("option", ["--list-models", "--list-gpu"])
def test_an_unknown_list_option_is_quoted_whole(capsys, option):
    """The hint quoted `--list` (the name cut at its first hyphen) and offered --model for --list-models."""
    rc, _, err = run(capsys, option)
    assert rc == 2 and f"unknown option {option}: did you mean --list-gpus?" in err
    assert "unknown option --list:" not in err


def test_errors_name_the_field(capsys):
    rc, _, err = run(capsys, "--model", "gpt2-small", "--train.micro_batch", "4")
    assert rc == 2 and "micro_batch_size" in err
    rc, _, err = run(capsys, "--model", "gpt2-smal")
    assert rc == 2 and "gpt2-small" in err
    rc, _, err = run(capsys, "--model", "gpt2-small", "--train.precision", "bf16", "--gpu", "v100-16g")
    assert rc == 2 and "bfloat16" in err
    rc, _, err = run(capsys, "--model", "gpt2-small", "--gpu", "h1")  # ambiguous: h100-sxm and h100-pcie
    assert rc == 2 and "h100" in err
    rc, _, err = run(capsys, "--model", "gpt2-small", "--tokens", "lots")
    assert rc == 2 and "--tokens" in err


def test_a_shape_without_fit_says_it_needs_fit(capsys):
    rc, _, err = run(capsys, "--model", "8x64")
    assert rc == 2 and "--model 8x64: a shape LAYERSxD_MODEL is read with --fit" in err
    assert "--model.n_layer 8 --model.d_model 64" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args,said", [
    (["--train.lr", "-1"], "train.lr=-1.0: must be >= 0.0"),
    (["--train.min_lr", "0.1", "--train.lr", "0.01"], "train.min_lr=0.1 is above train.lr=0.01"),
    (["--train.warmup_steps", "20", "--train.max_steps", "10"], "train.warmup_steps=20 > train.max_steps=10"),
])
def test_plan_refuses_the_train_values_pretrain_refuses(capsys, args, said):
    from gptforge.commands.pretrain import build_parser
    from gptforge.options import parse_command

    rc, _, err = run(capsys, "--model", "gpt2-nano", *args)
    assert rc == 2 and f"gptforge plan: error: {said}" in err
    _, init = parse_command(build_parser(), ["--data", "d", "--out", "o", *args])  # the same check as pretrain's
    with pytest.raises(ValueError, match=said):
        init.train.check_trainable()


def test_plan_still_models_planner_only_values(capsys):
    rc, out, err = run(capsys, "--model", "gpt2-nano", "--train.optimizer", "adafactor", "--train.precision", "fp8")
    assert rc == 0 and "optimizer adafactor" in out, err


def test_a_missing_recipe_is_one_line_naming_the_option(capsys, tmp_path):
    missing = str(tmp_path / "missing.toml")
    rc, _, err = run(capsys, "--model", "gpt2-nano", "--config", missing)
    assert rc == 2 and err.strip() == f"gptforge plan: error: --config {missing}: no such file " \
                                      "(give a YAML recipe with one section per config group)"
    rc, _, err = run(capsys, "--model", "gpt2-nano", f"--config={tmp_path}")
    assert rc == 2 and err.strip().startswith(f"gptforge plan: error: --config {tmp_path}: is a folder, not a file")


def test_measure_flag_prints_tracked_peak(capsys):
    rc, out, _ = run(capsys, "--model", "gpt2-nano", "--model.vocab_size", "1000", "--train.micro_batch_size", "2",
                     "--measure")
    assert rc == 0 and "tracked peak" in out


def test_dispatcher_knows_plan(capsys):
    assert cli_main(["plan", "--list-gpus"]) == 0
    assert "h200" in capsys.readouterr().out


@pytest.mark.parametrize("text,value", [("2T", 2e12), ("300B", 3e11), ("1.5e12", 1.5e12), ("1_000", 1e3)])
def test_parse_tokens(text, value):
    assert parse_tokens(text) == value


def test_common_gpu_names_resolve(capsys):
    for name, full in (("h100", "h100-sxm"), ("a100", "a100-80g"), ("4090", "rtx4090"), ("H100-PCIe", "h100-pcie"),
                       ("l40", "l40s")):
        rc, out, err = run(capsys, "--model", "gpt2-small", "--gpu", name)
        assert rc == 0, err
        assert f"x {full} (" in out
