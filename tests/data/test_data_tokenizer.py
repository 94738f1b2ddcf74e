"""Byte-level BPE tokenizer: exact round trip, special tokens only by explicit id, save/load."""

from __future__ import annotations

import json
import os
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gptforge.data.tokenizer import EOS_TOKEN, Tokenizer, train_bpe

SCRIPTS = st.sampled_from([
    (0x20, 0x7E),      # ASCII
    (0x4E00, 0x9FFF),  # CJK ideographs
    (0x3040, 0x30FF),  # kana
    (0x1F300, 0x1FAFF),  # emoji
    (0x0400, 0x04FF),  # Cyrillic
    (0x0590, 0x06FF),  # Hebrew, Arabic
    (0x0300, 0x036F),  # combining marks
])
MIXED = st.lists(SCRIPTS.flatmap(lambda r: st.text(st.characters(min_codepoint=r[0], max_codepoint=r[1]), min_size=1, max_size=8)),
                 max_size=12).map("".join)


@settings(max_examples=150, deadline=None)
@given(text=st.one_of(MIXED, st.text(max_size=200)))
def test_round_trip_any_unicode(small_tokenizer, text):
    ids = small_tokenizer.encode(text)
    assert all(0 <= i < small_tokenizer.vocab_size for i in ids)
    assert small_tokenizer.decode(ids) == text


def test_round_trip_examples(small_tokenizer):
    for text in ["你好，世界。", "emoji 🎉🚀👩‍👩‍👧 flags 🇫🇷", "mixed: naïve café Ελληνικά 日本語 한국어 עברית",
                 "  leading spaces\n\n\ttabs\r\n", "\x00\x01 control"]:
        assert small_tokenizer.decode(small_tokenizer.encode(text)) == text
    # The trained merges are used (far fewer tokens than bytes on text like the training data).
    text = "def __init__(self):\n        return None\n"
    assert len(small_tokenizer.encode(text)) < len(text.encode()) / 2


def test_literal_special_token_is_plain_text(small_tokenizer):
    tok = small_tokenizer
    assert tok.eos_id == tok.token_to_id(EOS_TOKEN) == 0
    for text in [EOS_TOKEN, f"a{EOS_TOKEN}b", f"x {EOS_TOKEN}\n{EOS_TOKEN}"]:
        ids = tok.encode(text)
        assert tok.eos_id not in ids
        assert tok.decode(ids) == text
        assert tok.encode_batch([text, "y"])[0] == ids


def test_encode_template_inserts_special_ids(small_tokenizer):
    tok = small_tokenizer
    ids = tok.encode_template(["hello", tok.eos_id, f"x{EOS_TOKEN}", tok.eos_id])
    assert ids == tok.encode("hello") + [tok.eos_id] + tok.encode(f"x{EOS_TOKEN}") + [tok.eos_id]
    assert ids.count(tok.eos_id) == 2
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.encode_template([tok.vocab_size])
    with pytest.raises(TypeError):
        tok.encode_template([1.5])


def test_save_load_hash_and_pickle(small_tokenizer, tmp_path):
    tok = small_tokenizer
    path = tmp_path / "sub" / "tokenizer.json"
    tok.save(path)
    assert os.listdir(path.parent) == ["tokenizer.json"]  # no temp file left behind
    loaded = Tokenizer.from_file(path)
    assert loaded.sha256 == tok.sha256 and loaded.vocab_size == tok.vocab_size == 512
    text = f"round {EOS_TOKEN} trip 你好"
    assert loaded.encode(text) == tok.encode(text)
    assert loaded.eos_id not in loaded.encode(EOS_TOKEN)  # the plain-text rule survives loading
    clone = pickle.loads(pickle.dumps(tok))
    assert clone.sha256 == tok.sha256 and clone.encode(text) == tok.encode(text)
    other = train_bpe(["completely different text"] * 10, vocab_size=300)
    assert other.sha256 != tok.sha256


def test_bad_tokenizer_inputs(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.json"):
        Tokenizer.from_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not a tokenizer")
    with pytest.raises(ValueError, match="bad.json"):
        Tokenizer.from_file(bad)
    with pytest.raises(ValueError, match="minimum 257"):
        train_bpe(["x"], vocab_size=100)


# ---- readable vocabulary ------------------------------------------------------------------------


def test_readable_vocab_shows_text_bytes_and_special(tmp_path):
    from gptforge.data.tokenizer import readable_vocab, token_bytes

    tok = train_bpe(["你好，世界。我们测试中文。 hello world\n"] * 50, vocab_size=300)
    rows = readable_vocab(tok)
    assert [r["id"] for r in rows] == list(range(tok.vocab_size))
    assert rows[tok.eos_id] == {"id": tok.eos_id, "kind": "special", "text": "<|endoftext|>"}
    by_text = {r["text"]: r for r in rows}
    assert by_text["你好"]["kind"] == "text" and by_text[" hello"]["kind"] == "text"
    # Every token's shown form is its bytes: text decodes them, <0xNN> spells the rest.
    for r in rows:
        if r["kind"] == "special":
            continue
        raw = token_bytes(tok.id_to_token(r["id"]))
        if r["kind"] == "bytes":
            assert "<0x" in r["text"] and raw.decode("utf-8", errors="replace") != raw.decode("utf-8", errors="ignore")
        else:
            assert raw.decode("utf-8") == r["text"] or "\\" in r["text"]
    # A lone lead byte of a Han character is a byte token; the newline is escaped.
    assert by_text["<0xE4>"]["kind"] == "bytes" and "\\n" in by_text


def test_vocab_command(tmp_path, capsys):
    from gptforge.cli import main

    tok = train_bpe(["你好，世界。我们测试中文。"] * 50, vocab_size=300)
    tok.save(tmp_path / "tokenizer.json")
    assert main(["vocab", str(tmp_path), "--kind", "special"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{tmp_path / 'tokenizer.json'}: {tok.vocab_size} tokens (")
    assert out[1:] == [f"{tok.eos_id}\tspecial\t<|endoftext|>"]
    assert main(["vocab", str(tmp_path / "tokenizer.json"), "--json", "--limit", "2"]) == 0
    assert [json.loads(x)["id"] for x in capsys.readouterr().out.splitlines()] == [0, 1]
    assert main(["vocab", str(tmp_path / "missing")]) == 1
    assert "gptforge vocab: error: no tokenizer.json at" in capsys.readouterr().err
