import random

import pytest

from gptforge.infer.stream import REPLACEMENT, StopStringFilter, StreamDetokenizer
from tests.infer.conftest import MIXED


def _stream(tok, ids):
    d = StreamDetokenizer(tok.decode)
    deltas = [d.push(i) for i in ids]
    return deltas, d.flush()


def test_deltas_are_whole_characters_and_concatenate_to_the_text(byte_tokenizer):
    tok = byte_tokenizer
    texts = [MIXED, "👍🏽👍🏽👍🏽", "中文" * 7, "a👩🏾‍💻b", MIXED[::-1]]
    split_inside_a_character = 0
    for text in texts:
        ids = tok.encode(text)
        split_inside_a_character += sum(REPLACEMENT in tok.decode([i]) for i in ids)
        deltas, tail = _stream(tok, ids)
        assert "".join(deltas) + tail == tok.decode(ids) == text
        assert tail == ""
        assert not any(REPLACEMENT in d for d in deltas)
        assert sum(1 for d in deltas if d) < len(ids) or text.isascii()
    assert split_inside_a_character > 20  # the test really exercises split characters


def test_random_token_sequences_never_repeat_or_drop_text(byte_tokenizer):
    tok = byte_tokenizer
    rng = random.Random(0)
    for _ in range(30):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 40))]
        deltas, tail = _stream(tok, ids)
        assert "".join(deltas) + tail == tok.decode(ids)


def test_an_unfinished_character_is_held_until_flush(byte_tokenizer):
    tok = byte_tokenizer
    ids = tok.encode("ok 👍🏽")
    d = StreamDetokenizer(tok.decode)
    out = "".join(d.push(i) for i in ids[:-1])
    assert not out.endswith(REPLACEMENT) and "👍🏽".startswith(out[3:]) and len(out) < 5
    assert out + d.push(ids[-1]) + d.flush() == "ok 👍🏽"


@pytest.mark.parametrize("chunks", [["Hello wor", "ld! STOP", " more"], ["ST", "O", "P"], ["aSTO", "Xb"],
                                    ["xS", "TOP"]])
def test_stop_string_filter_holds_back_a_possible_start(chunks):
    f = StopStringFilter(["STOP", "never"])
    out, stopped = "", False
    for c in chunks:
        piece, stopped = f.push(c)
        out += piece
        if not stopped:  # a tail that could begin "STOP" is never emitted early
            assert not any(out.endswith("STOP"[:k]) for k in (1, 2, 3)), out
    if not stopped:
        out += f.flush()
    full = "".join(chunks)
    assert out == (full[: full.find("STOP")] if "STOP" in full else full)
    assert stopped == ("STOP" in full)
