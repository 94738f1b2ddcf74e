"""Smaller things that were said wrongly or not at all (issue 41 item 7), train side."""

from __future__ import annotations

from gptforge.config import TrainConfig
from gptforge.train.resolve import resolve_mixture


def test_data_weights_that_do_not_sum_to_one_are_said_as_given_and_scaled():
    said: list[str] = []
    tc = resolve_mixture(TrainConfig(data_weights={"en": 0.7, "zh": 0.7}), {"en": 100, "zh": 100}, None, say=said.append)
    assert tc.data_weights == {"en": 0.5, "zh": 0.5}
    (line,) = said
    assert "en 0.500, zh 0.500" in line and "given as en=0.7, zh=0.7" in line and "sum to 1" in line
    said.clear()
    resolve_mixture(TrainConfig(data_weights={"en": 0.7, "zh": 0.3}), {"en": 100, "zh": 100}, None, say=said.append)
    assert said[0].endswith("(as given)")


def test_report_on_a_run_without_metrics_says_so(tmp_path):
    import subprocess
    import sys

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: {d_model: 32}\ntrain: {max_steps: 5}\n")
    done = subprocess.run([sys.executable, "-m", "gptforge.cli", "report", str(run), "--quiet"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"{run}: no metrics.jsonl" in done.stderr and "no curves" in done.stderr
