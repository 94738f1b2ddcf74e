"""A val split shorter than one window: the warning names the fix the user can apply where it is shown
(`gptforge prepare`'s options for a pretrain user; the quickstart's own for a quickstart user)."""

from __future__ import annotations

from gptforge.config import TrainConfig
from gptforge.train.sources import ShardSource


def short_val_warning(source: ShardSource, lines: list[str]) -> str:
    """Open `source`'s batches at a window one token longer than its val split; return the warning."""
    val_tokens = int(source.meta["splits"]["val"]["tokens"])
    assert source.meta["splits"]["train"]["tokens"] > val_tokens + 1  # the train split still fits a window
    source.batches(val_tokens, TrainConfig(micro_batch_size=1, eval_interval=1), 0, 1)
    try:
        assert not source.has_val
        (warning,) = [m for m in lines if m.startswith("WARNING: no validation")]
        return warning
    finally:
        source.close()


def test_pretrain_warning_names_prepare_options(tiny_shards):
    lines: list[str] = []
    warning = short_val_warning(ShardSource(tiny_shards, log=lines.append), lines)
    assert "Prepare with a larger --val-fraction" in warning and "--doc-separator" in warning
    assert "model.block_size" in warning and "--max-files" not in warning


def test_pretrain_short_train_error_keeps_its_wording(tiny_shards):
    """A train split shorter than one window: pretrain's error (ShardSource.check_window, also run by batches)."""
    import pytest

    from gptforge.errors import InputError

    source = ShardSource(tiny_shards)
    n = int(source.meta["splits"]["train"]["tokens"])
    source.check_window(n - 2)  # one window fits
    with pytest.raises(InputError, match=f"{n} train tokens, fewer than one window of {n + 1} tokens.*"
                                         "use a smaller block size or more data"):
        source.batches(n, TrainConfig(micro_batch_size=1), 0, 1)
