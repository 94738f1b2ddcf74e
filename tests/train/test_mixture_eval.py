"""Per-source evaluation of a mixture (issue 25 item 3): logged at every evaluation, equal to
`gptforge evaluate RUN --data DIR` of the same checkpoint; a split asked for more windows than it
holds scores each window once and says so; early stopping on a named source."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.data.loader import TokenStream, eval_windows
from gptforge.data.prepare import PrepareConfig
from gptforge.data.prepare_sources import prepare_sources
from gptforge.errors import InputError
from gptforge.train.loggers import read_metrics
from gptforge.train.run import train
from tests.conftest import stdlib_sample_files

MODEL = dict(arch="llama", n_layer=1, n_head=2, n_kv_head=2, d_model=32, block_size=32, dropout=0.0)


@pytest.fixture(scope="module")
def mixture(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixeval")
    files = stdlib_sample_files(12)
    srcs = {"lib": [str(p) for p in files[:8]], "more": [str(p) for p in files[8:12]]}
    prepare_sources(PrepareConfig(inputs=[], out=str(root / "mix"), vocab_size=320, val_fraction=0.25, workers=1),
                    srcs, show_progress=False)
    return root / "mix"


def test_eval_windows_score_each_window_once_when_asked_for_more():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "val.bin"
        np.arange(100, dtype=np.uint16).tofile(p)
        stream = TokenStream([p], "uint16")
        assert eval_windows(stream, 32, 500).tolist() == [0, 32, 64]  # (100 - 1) // 32 windows, each once
        assert len(set(eval_windows(stream, 32, 3).tolist())) == 3
        stream.close()


def test_per_source_val_is_logged_and_equals_evaluate_data(mixture, tmp_path):
    said = []
    cfg = RunConfig(model=ModelConfig(**MODEL), train=TrainConfig(
        max_steps=6, micro_batch_size=2, eval_interval=3, eval_steps=400, checkpoint_interval=6, tensorboard=False,
        report=False, seed=3, lr=1e-3, warmup_steps=1, spike_alarms=False, best_metric="val/more/loss"))
    train(cfg, str(mixture), tmp_path / "run", progress=False, log=said.append)
    assert any("each is scored once" in m and "fewer than the 800 asked" in m for m in said)
    rows = [r for r in read_metrics(tmp_path / "run") if "val_loss" in r]
    assert [r["step"] for r in rows] == [3, 6]
    last = rows[-1]
    out = subprocess.run([sys.executable, "-m", "gptforge.cli", "evaluate", str(tmp_path / "run"), "--data",
                          str(mixture), "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    for name in ("lib", "more"):
        assert res["sources"][name]["loss"] == pytest.approx(last[f"val/{name}/loss"], rel=1e-6)
        assert res["sources"][name]["bits_per_byte"] == pytest.approx(last[f"val/{name}/bpb"], rel=1e-6)
        assert res["sources"][name]["windows"] < 800
    assert res["loss"] == pytest.approx(last["val_loss"], rel=1e-6)
    with pytest.raises(InputError, match="val/lib/loss"):
        train(RunConfig(model=cfg.model, train=TrainConfig(**{**vars(cfg.train), "best_metric": "val/web/loss"})),
              str(mixture), tmp_path / "bad", progress=False)
