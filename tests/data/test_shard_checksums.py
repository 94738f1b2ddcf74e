"""Shards carry a SHA-256 per file, checked when a run starts and in full by `prepare --verify`;
an id at or above the vocabulary is an error naming the shard and offset (issue 41 item 4)."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys

import numpy as np
import pytest

from gptforge.data.prepare import PrepareConfig, prepare
from gptforge.errors import DamagedFileError

WORDS = "the river city garden market school teacher children morning winter summer bridge station".split()


@pytest.fixture
def shards(tmp_path):
    rng = random.Random(3)
    src = tmp_path / "src"
    src.mkdir()
    for k in range(30):
        (src / f"{k:02d}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(300)) + ".", encoding="utf-8")
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "data"), recipe="none", vocab_size=300,
                          val_fraction=0.2, workers=1), show_progress=False)
    return tmp_path / "data"


def _damage(path, value: int, at: int) -> None:
    """Overwrite 50 ids at token offset `at` with `value` (the file keeps its size)."""
    a = np.fromfile(path, dtype="<u2")
    a[at:at + 50] = value
    a.tofile(path)


def test_meta_records_each_files_sha256(shards):
    meta = json.loads((shards / "meta.json").read_text())
    names = [f for s in meta["splits"].values() for f in s["files"]]
    assert names and meta["file_sha256"] == {n: hashlib.sha256((shards / n).read_bytes()).hexdigest() for n in names}


def test_damaged_ids_below_the_vocabulary_are_caught_at_run_start(shards):
    from gptforge.config import TrainConfig
    from gptforge.data.shard_verify import verify_shards
    from gptforge.train.sources import ShardSource

    _damage(shards / "train_000.bin", 7, 1000)  # valid ids: only the checksum can tell
    with pytest.raises(DamagedFileError, match=r"train_000\.bin.*SHA-256"):
        verify_shards(shards)
    source = ShardSource(shards, eval_steps=2, micro_batch_size=2)
    with pytest.raises(DamagedFileError, match=r"train_000\.bin"):
        source.batches(16, TrainConfig(micro_batch_size=2, eval_interval=0), 0, 1)
    source.close()


def test_an_id_at_or_above_the_vocabulary_names_the_shard_and_offset(shards):
    from gptforge.data.loader import TokenStream

    meta = json.loads((shards / "meta.json").read_text())
    _damage(shards / "train_000.bin", 60000, 1000)
    stream = TokenStream([shards / f for f in meta["splits"]["train"]["files"]], "uint16",
                         vocab_size=meta["vocab_size"])
    assert stream.read(0, 900).max() < meta["vocab_size"]
    with pytest.raises(DamagedFileError, match=r"train_000\.bin: token id 60000 at token offset 1,000.*vocab_size 300"):
        stream.read(900, 200)
    stream.close()


def test_prepare_verify_cli(shards):
    cmd = [sys.executable, "-m", "gptforge.cli", "prepare", "--verify", str(shards)]
    ok = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "ok" in ok.stdout and "train_000.bin" not in ok.stderr
    _damage(shards / "val_000.bin", 5, 10)
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "val_000.bin" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    extra = subprocess.run(cmd + ["--out", str(shards) + "-x"], capture_output=True, text=True, timeout=300)
    assert extra.returncode == 2 and "takes no input files" in extra.stderr, extra.stderr  # not silently dropped
