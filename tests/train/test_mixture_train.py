"""Training on a weighted mixture of shard folders (issue 25 item 2).

Two folders prepared with one tokenizer train as a mixture: every step's metrics row records the
tokens drawn per source, within one sequence of the cumulative weight x tokens; 1 and 2 gloo
ranks draw the same global batches; a resume continues bit-exactly; folders of other tokenizers
are refused naming both.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.errors import InputError
from gptforge.train.loggers import read_metrics
from gptforge.train.run import train
from gptforge.train.sources.mixture import MixtureSource, open_source, parse_data_weights
from tests.conftest import stdlib_sample_files
from tests.train.dist_harness import run_layouts

MODEL = dict(arch="gpt2", n_layer=2, n_head=2, d_model=32, block_size=32, dropout=0.0)
TRAIN = dict(max_steps=12, micro_batch_size=2, gradient_accumulation_steps=2, eval_interval=6, eval_steps=2,
             checkpoint_interval=0, tensorboard=False, report=False, seed=5, lr=1e-3, warmup_steps=2,
             spike_alarms=False)
WEIGHTS = {"data": 0.75, "b": 0.25}


def _prepare(out, files, tokenizer=None, vocab_size=384):
    from gptforge.data.prepare import PrepareConfig, prepare

    prepare(PrepareConfig(inputs=[str(p) for p in files], out=str(out), vocab_size=vocab_size, val_fraction=0.1,
                          workers=1, tokenizer=tokenizer), show_progress=False)
    return out


@pytest.fixture(scope="module")
def second_source(tiny_shards, tmp_path_factory):
    """Other standard-library files, tokenized with tiny_shards' tokenizer: source "b"."""
    taken = set(stdlib_sample_files())
    files = [p for p in stdlib_sample_files(80) if p not in taken][:30]
    return _prepare(tmp_path_factory.mktemp("mix") / "b", files, tokenizer=str(tiny_shards / "tokenizer.json"))


def _cfg(**train) -> RunConfig:
    return RunConfig(model=ModelConfig(**MODEL), train=TrainConfig(**{**TRAIN, **train}))


def _check_proportions(rows: list[dict], weights: dict[str, float], tokens_per_step: int, seq_len: int) -> None:
    """Per step, each source's cumulative tokens are within one sequence of weight x all tokens."""
    cum = {n: 0 for n in weights}
    for i, r in enumerate(rows, start=1):
        assert sum(r[f"data/{n}/tokens"] for n in weights) == tokens_per_step
        for n, w in weights.items():
            cum[n] += r[f"data/{n}/tokens"]
            assert abs(cum[n] - w * tokens_per_step * i) < seq_len, (i, n, cum)


def test_parse_data_weights_and_a_tokenizer_mismatch(tiny_shards, tmp_path):
    assert parse_data_weights("en=0.7, zh=0.3") == {"en": 0.7, "zh": 0.3}
    with pytest.raises(InputError, match="NAME=WEIGHT"):
        parse_data_weights("en:0.7")
    other = _prepare(tmp_path / "other", stdlib_sample_files(5), vocab_size=300)
    with pytest.raises(InputError, match="different tokenizers") as e:
        open_source([str(tiny_shards), str(other)], 2, 2)
    a = json.loads((tiny_shards / "meta.json").read_text())["tokenizer_sha256"][:12]
    b = json.loads((other / "meta.json").read_text())["tokenizer_sha256"][:12]
    assert str(tiny_shards) in str(e.value) and str(other) in str(e.value) and a in str(e.value) and b in str(e.value)


def test_a_mixture_trains_with_exact_proportions_and_resumes_bit_exactly(tiny_shards, second_source, tmp_path):
    import yaml

    data = [str(tiny_shards), str(second_source)]
    full = train(_cfg(data_weights=WEIGHTS, checkpoint_interval=4), data, tmp_path / "full", progress=False)
    rows = read_metrics(tmp_path / "full")
    _check_proportions(rows, WEIGHTS, 4 * 32, 32)
    assert all(f"data/{n}/epoch" in rows[-1] for n in WEIGHTS)
    evals = [r for r in rows if "val_loss" in r]
    assert len(evals) == 2 and all(f"val/{n}/loss" in r and f"val/{n}/bpb" in r for r in evals for n in WEIGHTS)
    # Overall val loss: the token-weighted mean over the sources' val splits.
    t = {n: json.loads((d / "meta.json").read_text())["splits"]["val"]["tokens"]
         for n, d in (("data", tiny_shards), ("b", second_source))}
    r = evals[-1]
    assert r["val_loss"] == pytest.approx(sum(t[n] * r[f"val/{n}/loss"] for n in t) / sum(t.values()), rel=1e-9)
    # Interrupted at step 4 (a checkpoint), resumed: the same losses bit for bit.
    train(_cfg(data_weights=WEIGHTS, checkpoint_interval=4, stop_at_step=4), data, tmp_path / "cut", progress=False)
    train(_cfg(data_weights=WEIGHTS, checkpoint_interval=4), data, tmp_path / "cut", resume=True, progress=False)
    assert [r["loss"] for r in read_metrics(tmp_path / "cut")] == [r["loss"] for r in rows]
    assert full.step == 12
    # Other weights on resume apply from the resume step on (as a changed schedule_start does):
    # the steps before it keep the run's weights, recorded as a stage; the new quota continues.
    train(_cfg(data_weights=WEIGHTS, checkpoint_interval=4, stop_at_step=4), data, tmp_path / "turn", progress=False)
    said = []
    train(_cfg(data_weights={"data": 0.5, "b": 0.5}, checkpoint_interval=4), data, tmp_path / "turn", resume=True,
          progress=False, log=said.append)
    assert any("--resume at step 4" in m for m in said)
    turned = read_metrics(tmp_path / "turn")
    assert [r["loss"] for r in turned[:4]] == [r["loss"] for r in rows[:4]]
    saved = yaml.safe_load((tmp_path / "turn" / "config.yaml").read_text())["train"]
    assert saved["stages"] == [{"until_step": 4, "data_weights": WEIGHTS}]
    assert saved["data_weights"] == {"data": 0.5, "b": 0.5}
    b_after = sum(r["data/b/tokens"] for r in turned[4:])
    assert abs(sum(r["data/b/tokens"] for r in turned[:4]) - 0.25 * 4 * 128) < 32 and abs(b_after - 0.5 * 8 * 128) < 64


def test_default_weights_are_proportional_and_recorded(tiny_shards, second_source, tmp_path):
    import yaml

    train(_cfg(max_steps=2, eval_interval=0), [str(tiny_shards), str(second_source)], tmp_path / "run",
          progress=False)
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    n = {name: json.loads((d / "meta.json").read_text())["splits"]["train"]["tokens"]
         for name, d in (("data", tiny_shards), ("b", second_source))}
    assert saved["train"]["data_weights"] == pytest.approx({k: v / sum(n.values()) for k, v in n.items()})
    assert list(saved["data"]["sources"]) == ["data", "b"] and isinstance(saved["data"]["path"], list)
    with pytest.raises(InputError, match="one source"):
        train(_cfg(data_weights={"data": 1.0}), str(tiny_shards), tmp_path / "one", progress=False)


def test_rank_slices_of_two_ranks_are_the_global_batch_of_one(tiny_shards, second_source):
    folders = {"data": tiny_shards, "b": second_source}
    tc = TrainConfig(**{**TRAIN, "data_weights": WEIGHTS, "gradient_accumulation_steps": 4})
    one = MixtureSource(folders).batches(32, tc, 0, 1)
    tc2 = TrainConfig(**{**TRAIN, "data_weights": WEIGHTS, "gradient_accumulation_steps": 2})
    two = [MixtureSource(folders).batches(32, tc2, r, 2) for r in (0, 1)]
    for step in range(20):
        x1 = torch.cat([x for x, _ in one.micro_batches(step)])
        x2 = torch.cat([x for b in two for x, _ in b.micro_batches(step)])
        assert torch.equal(x1, x2)


def test_one_and_two_gloo_ranks_draw_the_same_batches(tiny_shards, second_source, tmp_path):
    data = [str(tiny_shards), str(second_source)]
    single = train(_cfg(data_weights=WEIGHTS, eval_interval=0), data, tmp_path / "one", progress=False)
    job = {"name": "ddp", "model": MODEL, "train": {**TRAIN, "data_weights": WEIGHTS, "eval_interval": 0,
                                                    "gradient_accumulation_steps": 1},
           "parallel": {"dp_replicate": 2, "dp_shard": 1}, "data": data, "run_dir": str(tmp_path / "ddp")}
    res = run_layouts(2, [job], tmp_path / "out")["ddp"]
    assert "error" not in res, res.get("error")
    rows1, rows2 = read_metrics(tmp_path / "one"), res["rows"]
    for n in WEIGHTS:
        assert [r[f"data/{n}/tokens"] for r in rows1] == [r[f"data/{n}/tokens"] for r in rows2]
    _check_proportions(rows2, WEIGHTS, 4 * 32, 32)
    # The same global batch each step: the same losses up to the order of the gradient sums.
    np.testing.assert_allclose(res["loss"], [r["loss"] for r in single.history], rtol=1e-4)


def test_stages_change_weights_at_the_boundary_and_resume_exactly(tiny_shards, second_source, tmp_path):
    import yaml

    from gptforge.report.page import write_run_report

    data = [str(tiny_shards), str(second_source)]
    stages = [{"until_fraction": 0.5, "data_weights": {"data": 0.25, "b": 0.75}}]
    cfg = dict(data_weights=WEIGHTS, stages=stages, checkpoint_interval=4, eval_interval=0)
    train(_cfg(**cfg), data, tmp_path / "full", progress=False)
    saved = yaml.safe_load((tmp_path / "full" / "config.yaml").read_text())["train"]
    assert saved["stages"] == [{"until_step": 6, "data_weights": {"data": 0.25, "b": 0.75}}]  # 0.5 x 12 steps
    rows = read_metrics(tmp_path / "full")
    assert [r["data/stage"] for r in rows] == [0] * 6 + [1] * 6  # rows of steps 1..12: step indices 0..11
    _check_proportions(rows[:6], {"data": 0.25, "b": 0.75}, 4 * 32, 32)
    assert sum(r["data/b/tokens"] for r in rows[:6]) == 0.75 * 6 * 4 * 32
    assert rows[-1]["data/b/tokens_seen"] == sum(r["data/b/tokens"] for r in rows)
    # Cut inside stage 1 (step 4), resumed across the boundary to step 8 (inside stage 2), then to the end.
    train(_cfg(**cfg, stop_at_step=4), data, tmp_path / "cut", progress=False)
    train(_cfg(**cfg, stop_at_step=8), data, tmp_path / "cut", resume=True, progress=False)
    train(_cfg(**cfg), data, tmp_path / "cut", resume=True, progress=False)
    assert [r["loss"] for r in read_metrics(tmp_path / "cut")] == [r["loss"] for r in rows]
    html = write_run_report(tmp_path / "full").read_text()
    assert "stage 1 ends" in html and "Data mixture" in html and "token-weighted mean" in html


def test_the_run_warns_at_start_when_a_source_repeats_beyond_four_epochs(tiny_shards, second_source):
    said = []
    source = MixtureSource({"data": tiny_shards, "b": second_source}, log=said.append)
    windows_b = (json.loads((second_source / "meta.json").read_text())["splits"]["train"]["tokens"] - 1) // 32
    steps = 5 * windows_b  # weight 0.25 x 4 sequences per step: 5 epochs of "b"
    source.batches(32, TrainConfig(**{**TRAIN, "data_weights": WEIGHTS, "max_steps": steps}), 0, 1)
    (line,) = [m for m in said if "repeats" in m and "'b'" in m]
    assert "5.0 epochs" in line and "Muennighoff" in line
    source.close()
