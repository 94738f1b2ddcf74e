"""Shard folder: written atomically, rolls files, reloads with numpy.memmap, checks its meta."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gptforge.data.shards import (
    ShardWriter,
    dtype_for_vocab,
    load_meta,
    load_tokenizer,
    open_split,
)


def _ids(tok, texts):
    out = []
    for t in texts:
        out += tok.encode(t) + [tok.eos_id]
    return np.array(out)


def test_write_roll_and_reload(small_tokenizer, tmp_path):
    tok = small_tokenizer
    out = tmp_path / "shards"
    docs = [f"document {i}: " + "some text " * (i + 1) for i in range(30)]
    with ShardWriter(out, tok, max_shard_bytes=200) as w:
        for d in docs[:-2]:
            w.write("train", _ids(tok, [d]), 1, len(d.encode()))
        w.write("val", _ids(tok, docs[-2:]), 2, sum(len(d.encode()) for d in docs[-2:]))
        meta = w.finish({"note": "test"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards"]  # temp folder renamed away
    assert load_meta(out) == meta == json.loads((out / "meta.json").read_text())
    assert meta["format"] == "gptforge-shards" and meta["format_version"] == 1
    assert meta["dtype"] == "uint16" and meta["eos_id"] == tok.eos_id and meta["vocab_size"] == 512
    assert meta["prepare_config"] == {"note": "test"}
    train = meta["splits"]["train"]
    assert len(train["files"]) > 1 and train["files"][0] == "train_000.bin"
    maps = open_split(out, "train")
    assert all(isinstance(m, np.memmap) and m.dtype == np.dtype("<u2") for m in maps)
    flat = np.concatenate(maps)
    assert flat.size == train["tokens"] and train["documents"] == 28
    assert int((flat == tok.eos_id).sum()) == 28
    for m in maps:  # files end at document boundaries
        assert m[-1] == tok.eos_id
    with pytest.raises(ValueError):
        maps[0][0] = 1  # read-only
    decoded = tok.decode(flat.tolist()).split(tok.eos_token)
    assert decoded[:-1] == docs[:-2]
    assert meta["splits"]["test"] == {"tokens": 0, "documents": 0, "bytes": 0, "files": []}
    assert open_split(out, "test") == []
    assert load_tokenizer(out).sha256 == tok.sha256 == meta["tokenizer_sha256"]


def test_dtype_choice():
    assert dtype_for_vocab(50257) == np.dtype("<u2")
    assert dtype_for_vocab(65536) == np.dtype("<u2")
    assert dtype_for_vocab(65537) == np.dtype("<u4")


def test_failed_write_leaves_nothing(small_tokenizer, tmp_path):
    out = tmp_path / "shards"
    with pytest.raises(RuntimeError):
        with ShardWriter(out, small_tokenizer) as w:
            w.write("train", np.array([1, 2, 0]), 1, 3)
            raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="vocab_size"):
        with ShardWriter(out, small_tokenizer) as w:
            w.write("train", np.array([512]), 1, 1)


def test_existing_output_needs_overwrite(small_tokenizer, tmp_path):
    out = tmp_path / "shards"
    with ShardWriter(out, small_tokenizer) as w:
        w.write("train", np.array([5, 0]), 1, 1)
        w.finish()
    with pytest.raises(FileExistsError, match="--overwrite"):
        ShardWriter(out, small_tokenizer)
    with ShardWriter(out, small_tokenizer, overwrite=True) as w:
        w.write("train", np.array([7, 8, 0]), 1, 2)
        w.finish()
    assert np.concatenate(open_split(out, "train")).tolist() == [7, 8, 0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards"]


def test_meta_errors(small_tokenizer, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_meta(tmp_path / "absent")
    (tmp_path / "half").mkdir()
    with pytest.raises(FileNotFoundError, match="meta.json"):
        load_meta(tmp_path / "half")
    out = tmp_path / "shards"
    with ShardWriter(out, small_tokenizer) as w:
        w.write("train", np.array([5, 0]), 1, 1)
        w.finish()
    meta = json.loads((out / "meta.json").read_text())
    (out / "meta.json").write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(ValueError, match="version 99"):
        load_meta(out)
    (out / "meta.json").write_text(json.dumps({**meta, "splits": {"train": {**meta["splits"]["train"], "tokens": 3}}}))
    with pytest.raises(ValueError, match="3"):
        open_split(out, "train")
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(KeyError):
        open_split(out, "dev")
    (out / "train_000.bin").unlink()
    with pytest.raises(FileNotFoundError, match="train_000.bin"):
        open_split(out, "train")
