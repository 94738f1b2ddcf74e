"""meta.json is checked against the .bin files when a shard folder is opened (issue 15 item 3)."""

from __future__ import annotations

import json
import shutil

import pytest

from gptforge.data.shards import load_meta
from gptforge.errors import DamagedFileError


@pytest.fixture
def shards(tiny_shards, tmp_path):
    out = tmp_path / "data"
    shutil.copytree(tiny_shards, out)
    return out


def _edit_meta(folder, fn):
    meta = json.loads((folder / "meta.json").read_text())
    fn(meta)
    (folder / "meta.json").write_text(json.dumps(meta))


def test_intact_folder_opens(shards):
    assert load_meta(shards)["splits"]["train"]["tokens"] > 0


def test_wrong_dtype_is_refused_with_the_numbers(shards):
    meta = load_meta(shards)
    assert meta["dtype"] == "uint16"
    tokens = meta["splits"]["train"]["tokens"]
    nbytes = sum((shards / f).stat().st_size for f in meta["splits"]["train"]["files"])

    def to_u32(m):
        m["dtype"] = "uint32"
    _edit_meta(shards, to_u32)
    with pytest.raises(DamagedFileError) as e:
        load_meta(shards)
    msg = str(e.value)
    assert f"{nbytes:,} bytes" in msg and f"{tokens:,}" in msg and "uint16" in msg and "train" in msg


def test_wrong_token_count_is_refused(shards):
    def more(m):
        m["splits"]["val"]["tokens"] += 3
    _edit_meta(shards, more)
    with pytest.raises(DamagedFileError, match="val"):
        load_meta(shards)


def test_truncated_file_is_refused(shards):
    meta = load_meta(shards)
    f = shards / meta["splits"]["train"]["files"][0]
    f.write_bytes(f.read_bytes()[:-64])
    with pytest.raises(DamagedFileError, match="train_000.bin"):
        load_meta(shards)


def test_ids_beyond_the_vocabulary_are_refused(shards):
    meta = load_meta(shards)
    f = shards / meta["splits"]["train"]["files"][0]
    raw = bytearray(f.read_bytes())
    raw[10:12] = (65535).to_bytes(2, "little")
    f.write_bytes(bytes(raw))
    with pytest.raises(DamagedFileError, match="65535"):
        load_meta(shards)


def test_a_folder_of_raw_text_given_as_shards_is_told_to_prepare_into_a_new_folder(tmp_path):
    raw = tmp_path / "txt"
    raw.mkdir()
    (raw / "a.txt").write_text("some text\n")
    with pytest.raises(FileNotFoundError) as e:
        load_meta(raw)
    assert f"gptforge prepare {raw} --out data/NAME" in str(e.value) and f"--out {raw}`" not in str(e.value)
    with pytest.raises(FileNotFoundError, match="is a file, not a shard folder"):
        load_meta(raw / "a.txt")
    (raw / "a.txt").unlink()  # an empty folder (an interrupted prepare) keeps the other advice
    with pytest.raises(FileNotFoundError, match="is not a complete shard folder"):
        load_meta(raw)
