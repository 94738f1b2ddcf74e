"""`gptforge generate` (and the commands sharing its device choice) name their own options in errors,
not the library's arguments (use_cache, compile) or the training config's fields (train.device)."""

from __future__ import annotations

import pytest
import torch

from gptforge.cli import main


def test_compile_without_cache_names_the_options(tmp_path, capsys):
    assert main(["generate", str(tmp_path / "no_run"), "--compile", "--no-cache"]) != 0
    err = capsys.readouterr().err
    assert "drop --no-cache or --compile" in err and "use_cache" not in err
    assert not (tmp_path / "no_run").exists()


def test_library_keeps_its_argument_names():
    from gptforge.infer.generate import generate

    with pytest.raises(ValueError, match=r"drop use_cache=False or compile=True"):
        generate(None, torch.tensor([[1]]), 1, use_cache=False, compile=True)  # refused before the model is used


@pytest.mark.parametrize("command", [["generate"], ["evaluate", "--text", "x.txt"], ["serve"]])
def test_unavailable_cuda_names_device_option(tmp_path, capsys, monkeypatch, command):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = [command[0], str(tmp_path / "no_run"), *command[1:], "--device", "cuda"]
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc not in (0, None), err
    assert "--device cuda but CUDA is not available here" in err and "train.device" not in err


def test_training_config_keeps_its_field_name(monkeypatch):
    from gptforge.runtime.device import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"train.device='cuda' but CUDA is not available here"):
        pick_device("cuda")


def test_a_device_name_torch_does_not_know_is_one_error_naming_the_option():
    from gptforge.runtime.device import pick_device

    with pytest.raises(ValueError, match=r"--device 'tpu': not a device; use auto, cpu, cuda"):
        pick_device("tpu", "--device")
    with pytest.raises(ValueError, match=r"train.device='': not a device"):
        pick_device("")
