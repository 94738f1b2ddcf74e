"""find_checkpoint: falls back past a missing `latest` or a damaged checkpoint (issue 15 items 10, 11)."""

from __future__ import annotations

import logging

import pytest
import torch

from gptforge.config import ModelConfig
from gptforge.model import GPT
from gptforge.runtime.checkpoint import (
    find_checkpoint,
    load_model_weights,
    save_checkpoint,
    step_dir_name,
    verify_checkpoint,
)


@pytest.fixture
def run(tmp_path):
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=2, n_head=2, d_model=32, block_size=32, vocab_size=64).resolved())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    root = tmp_path / "run" / "checkpoints"
    for step in (1, 2):
        model(torch.randint(0, 64, (2, 8))).sum().backward()
        opt.step()
        save_checkpoint(root, step, model, opt, {"step": step, "tokens_seen": step * 16}, "model: {}\n", keep=2)
    return tmp_path / "run", root


def _distcp(folder):
    files = sorted(folder.glob("*.distcp"))
    assert files
    return max(files, key=lambda p: p.stat().st_size)


def test_missing_latest_falls_back_to_the_newest_complete_step(run):
    run_dir, root = run
    (root / "latest").unlink()
    assert find_checkpoint(run_dir) == root / step_dir_name(2)


def test_truncated_distcp_falls_back_to_the_previous_checkpoint(run, caplog):
    run_dir, root = run
    f = _distcp(root / step_dir_name(2))
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    assert "shorter" in verify_checkpoint(root / step_dir_name(2))
    with caplog.at_level(logging.WARNING, logger="gptforge"):
        chosen = find_checkpoint(run_dir)
    assert chosen == root / step_dir_name(1)
    assert step_dir_name(2) in caplog.text and "damaged" in caplog.text
    model = GPT(ModelConfig(n_layer=2, n_head=2, d_model=32, block_size=32, vocab_size=64).resolved())
    load_model_weights(chosen, model)  # the fallback is loadable


def test_changed_trainer_state_fails_its_checksum(run):
    run_dir, root = run
    st = root / step_dir_name(2) / "trainer_state.pt"
    raw = bytearray(st.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    st.write_bytes(bytes(raw))
    assert "checksum" in verify_checkpoint(root / step_dir_name(2))
    assert find_checkpoint(run_dir) == root / step_dir_name(1)


def test_nothing_intact_is_a_clear_error(run):
    from gptforge.errors import DamagedFileError

    run_dir, root = run
    for step in (1, 2):
        f = _distcp(root / step_dir_name(step))
        f.write_bytes(b"")
    with pytest.raises(DamagedFileError, match=step_dir_name(2)):
        find_checkpoint(run_dir)
    assert verify_checkpoint(root / step_dir_name(1)) is not None


def test_intact_checkpoints_verify(run):
    _, root = run
    assert verify_checkpoint(root / step_dir_name(1)) is None
    assert verify_checkpoint(root / step_dir_name(2)) is None
    assert (root / step_dir_name(2) / "trainer_state.sha256").is_file()


def test_truncated_metadata_falls_back(run):
    run_dir, root = run
    md = root / step_dir_name(2) / ".metadata"
    md.write_bytes(md.read_bytes()[:40])
    assert ".metadata" in verify_checkpoint(root / step_dir_name(2))
    assert find_checkpoint(run_dir) == root / step_dir_name(1)


def test_partial_files_of_dead_writers_are_removed_and_a_failed_save_leaves_none(run):
    run_dir, root = run
    stale = root / ".tmp_step_0000009"
    stale.mkdir()
    (stale / "__0_0.distcp").write_bytes(b"x" * 1000)
    (root / ".latest.deadbeef.tmp").write_text("step_0000009\n")
    model = GPT(ModelConfig(n_layer=2, n_head=2, d_model=32, block_size=32, vocab_size=64).resolved())

    def boom(tmp):
        raise OSError(28, "No space left on device")
    with pytest.raises(OSError):
        save_checkpoint(root, 3, model, None, {"step": 3}, "model: {}\n", extra=boom)
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".")) == []
    assert find_checkpoint(run_dir) == root / step_dir_name(2)
