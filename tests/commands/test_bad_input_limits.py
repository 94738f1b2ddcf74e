"""Bad input the parse cannot see, each one line naming the option typed: a repeated option's bad
value, a seed past 64 bits, a KV cache larger than the machine (--num-samples, --max-batch-size),
a prepare option outside its range, and a folder where a file is wanted (or a file where a folder is)."""

from __future__ import annotations

import pytest

from gptforge.cli import main
from tests.infer.conftest import trained_run  # noqa: F401  (the suite's shared tiny run)


@pytest.fixture(scope="module")
def run(trained_run):  # noqa: F811
    return trained_run


def _err(argv, capsys) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err.strip()


@pytest.mark.parametrize("argv,line", [
    (["serve", "run", "--port", "abc", "--port", "8001"], "--port: invalid value 'abc'; expected an integer"),
    (["serve", "run", "--port", "8001", "--port", "abc"], "--port: invalid value 'abc'; expected an integer"),
    (["evaluate", "run", "--text", "t", "--split", "val", "--split", "bogus"],
     "--split: invalid value 'bogus'; allowed values: train, val, test"),
    (["generate", "run", "--seed", str(2**64)], f"--seed must be in [0, {2**64 - 1}], got {2**64}"),
    (["export", "run", "--format", "triton", "--out", "o", "--max-batch-size", "0"],
     "--max-batch-size must be in [1, 2147483647], got 0"),
    (["export", "run", "--format", "triton", "--out", "o", "--instances", str(10**20)],
     f"--instances must be in [1, 2147483647], got {10**20}"),
])
def test_the_bad_value_is_the_one_echoed(argv, line, capsys):
    rc, err = _err(argv, capsys)
    assert rc == 2 and err.endswith("error: " + line), err


def test_a_kv_cache_larger_than_memory_is_refused_naming_the_option(run, capsys, monkeypatch):
    from gptforge.runtime import device

    monkeypatch.setattr(device, "device_memory_bytes", lambda dev: 2**20)  # a 1 MiB machine
    rc, err = _err(["generate", str(run), "--prompt", "a", "--num-samples", "1000", "--max-new-tokens", "4"], capsys)
    assert rc == 2 and err.startswith("gptforge generate: error: --num-samples 1000: the KV cache of 1000 sequences")
    assert "lower --num-samples" in err and len(err.splitlines()) == 1
    rc, err = _err(["serve", str(run), "--max-batch-size", "1000", "--port", "1"], capsys)  # refused before binding
    assert rc == 2 and err.startswith("gptforge serve: error: --max-batch-size 1000: the KV cache of 1000 sequences")
    assert "x 64 positions" in err and "lower --max-batch-size or --max-model-len" in err
    monkeypatch.setattr(device, "device_memory_bytes", lambda dev: None)  # unknown: not refused
    assert main(["generate", str(run), "--prompt", "a", "--num-samples", "2", "--max-new-tokens", "2"]) == 0


def test_a_folder_for_a_file_is_named_as_such(run, tmp_path, capsys):
    rc, err = _err(["evaluate", str(run), "--text", str(tmp_path)], capsys)
    assert rc == 1 and err.endswith(f"--text {tmp_path}: is a folder, not a file (name one text file)")
    rc, err = _err(["evaluate", str(run), "--tasks", str(tmp_path)], capsys)
    assert rc == 1 and f"task file {tmp_path} is a folder, not a file" in err
    (tmp_path / "t.txt").write_text("def f(x):\n    return x\n" * 20)
    rc, err = _err(["evaluate", str(tmp_path / "no-such-run"), "--text", str(tmp_path / "t.txt"), "--out",
                    str(tmp_path)], capsys)  # refused before the model is looked for
    assert rc == 1 and err.endswith(f"--out {tmp_path} is a folder: give the path of a JSON file, such as "
                                    f"{tmp_path / 'results.json'}")


@pytest.mark.parametrize("args,line", [
    (["--min-frequency", "-1"], "--min-frequency must be >= 0, got -1"),
    (["--language-score", "5"], "--language-score must be in [0, 1], got 5.0"),
    (["--tokenizer-train-bytes", "-1"], "--tokenizer-train-bytes must be >= 0, got -1"),
    (["--vocab-size", str(10**20)], f"--vocab-size must be at most 4,294,967,296 (token ids are stored as uint32); "
                                    f"got {10**20}"),
])
def test_prepare_refuses_values_outside_their_range_before_writing(args, line, tmp_path, capsys):
    (tmp_path / "a.txt").write_text("some text\n")
    rc, err = _err(["prepare", str(tmp_path / "a.txt"), "--out", str(tmp_path / "out"), *args], capsys)
    assert rc == 2 and err == f"gptforge prepare: error: {line}"  # USAGE_EXIT, whichever check refused it
    assert not (tmp_path / "out").exists()


def test_a_folder_given_as_tokenizer_and_a_file_as_quickstart_out(run, tmp_path, capsys):
    (tmp_path / "a.txt").write_text("some text\n")
    rc, err = _err(["prepare", str(tmp_path / "a.txt"), "--out", str(tmp_path / "out"), "--tokenizer", str(run)],
                   capsys)
    assert rc == 1 and err.endswith(f"is a folder: give the tokenizer.json file in it ({run / 'tokenizer.json'})")
    rc, err = _err(["quickstart", "--out", str(tmp_path / "a.txt")], capsys)
    assert rc == 1 and err == (f"gptforge quickstart: error: --out {tmp_path / 'a.txt'} is a file: the quickstart "
                               "writes a folder there; choose another --out")
    assert (tmp_path / "a.txt").read_text() == "some text\n"


def test_train_seed_past_64_bits_is_refused_by_plan_and_pretrain(tiny_shards, tmp_path, capsys):
    rc, err = _err(["plan", "--model", "gpt2-nano", "--train.seed", str(10**20)], capsys)
    assert rc == 2 and err == f"gptforge plan: error: train.seed={10**20}: must be in [{-2**63}, {2**64 - 1}]"
    rc, err = _err(["pretrain", "--data", str(tiny_shards), "--out", str(tmp_path / "r"), "--model", "gpt2-nano",
                    "--train.seed", str(10**20)], capsys)
    assert rc == 2 and err.endswith(f"train.seed={10**20}: must be in [{-2**63}, {2**64 - 1}]")


def test_a_block_size_no_data_fills_is_refused_before_the_model_is_built(tiny_shards, tmp_path, capsys):
    # 10**12 learned positions would be 256 TB of weights: the data check must come first
    rc, err = _err(["pretrain", "--data", str(tiny_shards), "--out", str(tmp_path / "r"), "--model", "gpt2-nano",
                    "--model.block_size", str(10**12), "--train.max_steps", "1"], capsys)
    assert rc == 1 and f"fewer than one window of {10**12 + 1} tokens (block_size + 1)" in err.splitlines()[-1]


def test_a_file_where_a_folder_is_wanted_says_so(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    rc, err = _err(["plan", "--fit", str(tmp_path / "f"), "--model", "8x64", "--tokens", "10M"], capsys)
    assert rc == 1 and err.endswith("Not a directory (a file is there where a folder is wanted: check the path)")
