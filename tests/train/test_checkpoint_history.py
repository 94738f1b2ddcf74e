"""One training history per run folder: an orphan step folder newer than `latest`, resume and
spike rollback discard newer folders; the data path survives a resume from another folder; a
time budget says that it replaced max_steps."""

from __future__ import annotations

import shutil

import pytest
import torch
import yaml

from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.errors import MissingInputError
from gptforge.model import GPT
from gptforge.runtime.checkpoint import discard_newer, find_checkpoint, save_checkpoint, step_dir_name
from gptforge.train.loggers import read_metrics
from gptforge.train.resume import recorded_data_dir
from gptforge.train.run import train


def _saved(tmp_path, steps, latest):
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=2, n_head=2, d_model=32, block_size=32, vocab_size=64).resolved())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    root = tmp_path / "run" / "checkpoints"
    for step in steps:
        save_checkpoint(root, step, model, opt, {"step": step}, "model: {}\n", keep=10)
    (root / "latest").write_text(step_dir_name(latest) + "\n")  # as a kill before the pointer update leaves it
    return tmp_path / "run", root


def test_a_complete_step_folder_newer_than_latest_is_chosen(tmp_path):
    run_dir, root = _saved(tmp_path, (200, 206), latest=200)
    assert find_checkpoint(run_dir) == root / step_dir_name(206)
    # A damaged newer folder does not win over an intact `latest`.
    (root / step_dir_name(206) / "trainer_state.pt").write_bytes(b"cut")
    assert find_checkpoint(run_dir) == root / step_dir_name(200)


def test_discard_newer_removes_folders_and_pointers_past_the_continuation_point(tmp_path):
    _, root = _saved(tmp_path, (100, 200, 300), latest=300)
    (root / "best").write_text(step_dir_name(200) + "\n")
    removed = discard_newer(root, 100)
    assert [d.name for d in removed] == [step_dir_name(200), step_dir_name(300)]
    assert sorted(d.name for d in root.glob("step_*")) == [step_dir_name(100)]
    assert not (root / "latest").exists() and not (root / "best").exists()


def _events(run_dir, kind):
    return [e for row in read_metrics(run_dir) for e in row.get("events") or [] if e.get("kind") == kind]


def _cfg(max_steps=4, **kw):
    return RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=32),
                     train=TrainConfig(max_steps=max_steps, micro_batch_size=2, eval_interval=0, checkpoint_interval=2,
                                       warmup_steps=1, tensorboard=False, report=False, **kw))


def test_resume_from_an_older_step_removes_the_newer_folders(tiny_shards, tmp_path):
    run = tmp_path / "run"
    train(_cfg(4, keep_checkpoints=5), tiny_shards, run, progress=False)
    root = run / "checkpoints"
    assert (root / step_dir_name(4)).is_dir()
    # Force the resume point to step 2: step 4 damaged (its history must not come back later).
    (root / step_dir_name(4) / "trainer_state.pt").write_bytes(b"damaged")
    r = train(_cfg(6, keep_checkpoints=5), tiny_shards, run, resume=True, progress=False)
    assert r.step == 6
    names = sorted(d.name for d in root.glob("step_*"))
    assert step_dir_name(4) in names  # rewritten by the continued run, not the damaged one
    assert torch.load(root / step_dir_name(4) / "trainer_state.pt", weights_only=False)["step"] == 4
    assert find_checkpoint(run) == root / step_dir_name(6)


def test_rollback_removes_folders_newer_than_its_checkpoint(tiny_shards, tmp_path, monkeypatch):
    """A rollback to C deletes the step folders after C, so a later resume never picks one."""
    import gptforge.train.rollback as rollback_mod

    run = tmp_path / "run"
    train(_cfg(4, keep_checkpoints=5), tiny_shards, run, progress=False)
    root = run / "checkpoints"
    calls = {"n": 0}

    def trigger(events, bad_streak_full):
        calls["n"] += 1
        if calls["n"] == 1:  # an orphan of the pre-rollback history, newer than the rollback's checkpoint
            shutil.copytree(root / step_dir_name(4), root / step_dir_name(9))
            (root / step_dir_name(9) / "trainer_state.pt").write_bytes(b"damaged")
            return "loss spike"
        return None

    monkeypatch.setattr(rollback_mod, "rollback_trigger", trigger)
    r = train(_cfg(6, keep_checkpoints=5, spike_action="rollback"), tiny_shards, run, resume=True, progress=False)
    assert r.step == 6 and [e["to_step"] for e in _events(run, "rollback")] == [4]
    assert not (root / step_dir_name(9)).exists()
    assert find_checkpoint(run) == root / step_dir_name(6)


def test_data_path_is_recorded_absolute_and_old_relative_paths_are_found(tiny_shards, tmp_path, monkeypatch):
    run = tmp_path / "trial" / "runs" / "k1"
    train(_cfg(2), tiny_shards, run, progress=False)
    doc = yaml.safe_load((run / "config.yaml").read_text())
    assert doc["data"]["path"] == str(tiny_shards.resolve())
    # An old run recorded the path relative to its launch folder (tmp_path/trial).
    launch = tmp_path / "trial"
    shutil.copytree(tiny_shards, launch / "data" / "milton")
    doc["data"]["path"] = "data/milton"
    (run / "config.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.chdir(tmp_path)  # somewhere else
    assert recorded_data_dir(run) == str(launch.resolve() / "data" / "milton")
    shutil.rmtree(launch / "data")
    with pytest.raises(MissingInputError) as e:
        recorded_data_dir(run)
    assert str(tmp_path / "data" / "milton") in str(e.value) and "parent of" in str(e.value)


def test_max_minutes_says_it_replaced_an_explicit_max_steps(tiny_shards, tmp_path, monkeypatch):
    import gptforge.train.budget as budget

    monkeypatch.setattr(budget, "measure_step_seconds", lambda mc, tc, repeats=3, whole=True: 0.1)
    said = []
    r = train(_cfg(50, max_minutes=0.05), tiny_shards, tmp_path / "run", progress=False, log=said.append)
    line = [m for m in said if "train.max_minutes 0.05" in m]
    assert r.step == 30 and line and "train.max_steps 30" in line[0]  # 3 s / 0.1 s (no eval share)
    assert "replacing train.max_steps 50" in line[0] and "max_minutes 0 to keep max_steps" in line[0]
