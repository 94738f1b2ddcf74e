"""`gptforge plan --fit`: predictions, JSON, plot, errors, from run directories written in the test."""

import json

import yaml

from gptforge.commands.plan import main
from gptforge.config import ModelConfig
from gptforge.plan.fit import non_embedding_params, predict_loss

LAW = {"E": 1.7, "A": 40.0, "alpha": 0.34, "B": 40.0, "beta": 0.28}


def write_sweep(root, shapes=((2, 32), (2, 64), (4, 64), (4, 96)), tokens=(1e6, 2e6, 4e6), tok="tok"):
    for n_layer, d_model in shapes:
        model = {"arch": "gpt2", "n_layer": n_layer, "d_model": d_model, "n_head": d_model // 16,
                 "block_size": 64, "vocab_size": 384}
        n = non_embedding_params(ModelConfig(**model))
        for d in tokens:
            run = root / f"l{n_layer}_d{d_model}_t{int(d)}"
            run.mkdir(parents=True)
            (run / "config.yaml").write_text(yaml.safe_dump({
                "model": model, "train": {"max_steps": 100, "micro_batch_size": 8},
                "data": {"tokenizer_sha256": tok, "meta_sha256": "m"}}))
            loss = float(predict_loss(LAW, n, d))
            (run / "final_eval.json").write_text(json.dumps({"val_loss": loss, "tokens": d, "step": 100,
                                                             "stopped": "max_steps"}))
    return root


def run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_fit_json_prediction_target_and_plot(tmp_path, capsys):
    sweep = write_sweep(tmp_path / "sweep")
    plot = tmp_path / "fit.png"
    rc, out, err = run(capsys, "--fit", str(sweep), "--model", "8x64", "--tokens", "8M", "--target-loss", "2.6",
                       "--gpu", "h100-sxm", "--price", "2", "--bootstrap", "10", "--plot", str(plot), "--json")
    assert rc == 0, err
    d = json.loads(out)
    q = d["prediction"]
    n = non_embedding_params(ModelConfig(arch="gpt2", n_layer=8, d_model=64, n_head=4, block_size=64, vocab_size=384))
    assert q["n_params"] == n
    assert abs(q["loss"] - float(predict_loss(LAW, n, 8e6))) < 0.01
    assert q["warnings"] == []  # 2x N, 2x D: within the documented factor
    assert q["hardware"]["gpu_hours_high"] > q["hardware"]["gpu_hours_low"] > 0
    t = d["target"]
    assert t["reachable"] and t["tokens"] > 0 and t["hardware"]["cost_high"] > 0
    assert d["compute_optimal"]["flops"] == q["flops"]
    assert d["plot"] == str(plot) and plot.read_bytes()[:4] == b"\x89PNG"


def test_fit_human_report_warns_and_says_unreachable(tmp_path, capsys):
    sweep = write_sweep(tmp_path / "sweep")
    rc, out, _ = run(capsys, "--fit", str(sweep), "--model", "16x256", "--tokens", "100M", "--target-loss", "1.0",
                     "--bootstrap", "5")
    assert rc == 0
    assert "WARNING" in out and "largest the fit saw" in out
    assert "unreachable" in out and "irreducible" in out
    assert (sweep / "scaling_fit.png").is_file() and "scaling_fit.png" in out


def test_fit_errors_are_one_line(tmp_path, capsys):
    few = write_sweep(tmp_path / "few", shapes=((2, 32), (2, 64)), tokens=(1e6, 2e6))
    rc, _, err = run(capsys, "--fit", str(few))
    assert rc == 1 and "at least 5 finished runs" in err  # the sweep is input: not a bad option and err.count("\n") == 1
    a = write_sweep(tmp_path / "a", tok="one")
    b = write_sweep(tmp_path / "b", shapes=((2, 48),), tok="two")
    rc, _, err = run(capsys, "--fit", str(a), str(b))
    assert rc == 1 and "different tokenizers" in err
    rc, _, err = run(capsys, "--fit", str(tmp_path / "missing"))
    assert rc == 1 and "no such run" in err
