"""`gptforge.serve.app.load_model`: a run directory and its Hugging Face export serve the same model."""

import pytest
import torch

from gptforge.errors import InputError, MissingInputError
from gptforge.serve.app import load_model


def test_a_run_and_its_hf_export_load_the_same_model(trained_run, tmp_path):
    from gptforge.runtime.loading import to_hf

    hf_dir = to_hf(trained_run, tmp_path / "hf")
    run_model, run_tok, template = load_model(trained_run, "cpu")
    hf_model, hf_tok, _ = load_model(hf_dir, "cpu")
    assert template is None and run_tok.read_bytes() == hf_tok.read_bytes()
    idx = torch.tensor([[5, 17, 42, 99, 3]])
    with torch.no_grad():
        assert torch.allclose(run_model(idx), hf_model(idx), atol=1e-5)
    bf16, _, _ = load_model(trained_run, "cpu", "bf16")
    assert bf16.wte.weight.dtype == torch.bfloat16 and not bf16.training
    with torch.no_grad():
        assert torch.isfinite(bf16(idx).float()).all()


def test_load_model_errors_name_the_problem(tmp_path):
    with pytest.raises(MissingInputError, match="no such run directory"):
        load_model(tmp_path / "missing", "cpu")
    with pytest.raises(InputError, match="--precision 'fp8'"):
        load_model(tmp_path, "cpu", "fp8")


def test_serve_command_errors_are_one_line(tmp_path, trained_run, capsys):
    from gptforge.cli import main

    assert main(["serve", str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gptforge serve: error:") and "missing" in err[0]
    assert main(["serve", str(trained_run), "--max-model-len", "65"]) == 2  # USAGE_EXIT: a bad option
    assert "--max-model-len must be in 1..64" in capsys.readouterr().err
    for args, said in ((["--max-batch-size", "0"], "--max-batch-size must be >= 1"),
                       (["--max-queue", "-1"], "--max-queue must be >= 0, got -1")):
        with pytest.raises(SystemExit) as e:  # refused by the parser (the field's range), which exits itself
            main(["serve", str(trained_run), *args])
        assert e.value.code == 2 and said in capsys.readouterr().err


def test_serve_refuses_a_negative_engine_restarts(trained_run, capsys):
    from gptforge.cli import main

    with pytest.raises(SystemExit) as e:
        main(["serve", str(trained_run), "--engine-process", "--engine-restarts", "-1"])
    assert e.value.code == 2
    assert "--engine-restarts must be >= 0, got -1" in capsys.readouterr().err
