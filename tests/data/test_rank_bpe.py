"""tiktoken in prepare's encode phase: the Hugging Face tokenizer's ids, or the Hugging Face tokenizer."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers

from gptforge.data.rank_bpe import encode_texts, rank_encoder, rank_table
from gptforge.data.tokenizer import EOS_TOKEN, Tokenizer, _byte_level_decoder, train_bpe

pytest.importorskip("tiktoken")

TEXTS = [
    "The river's bank, they'll say, was 1234 metres long;   it wasn't.\n\n\tNext paragraph  \n",
    "我们在服务器上训练模型。第二句话，有标点！还有English混在里面，以及数字2024年。",
    "emoji 🙂🚀 and accents: café, naïve, Ærø; Ελληνικά, русский, العربية, हिन्दी",
    f"a literal {EOS_TOKEN} inside the text stays plain text",
    "code: def f(x):\n    return x ** 2  # comment\r\n" + " " * 17 + "\u00a0\u2003x",
    "",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" * 20,
]


@pytest.fixture(scope="module")
def trained() -> Tokenizer:
    rng = random.Random(3)
    words = "the of and river garden 我们 训练 模型 数据 服务器 you'll don't 2024 3.14 café".split()
    texts = [" ".join(rng.choice(words) for _ in range(200)) + "\n" for _ in range(60)] + TEXTS
    return train_bpe(texts, vocab_size=600)


def test_trained_tokenizer_is_encoded_by_tiktoken_with_the_same_ids(trained):
    check = rank_table(trained)
    assert check.ranks is not None, check.reason
    assert rank_encoder(trained) is not None
    rng = random.Random(5)
    vocab = [trained.decode([i]) for i in range(1, trained.vocab_size)]
    mixed = ["".join(rng.choice(vocab) for _ in range(rng.randint(2, 6))) for _ in range(3000)]
    texts = TEXTS + mixed
    assert encode_texts(trained, texts) == trained.encode_batch(texts)
    assert encode_texts(trained, [TEXTS[3]])[0] == trained.encode(TEXTS[3])
    assert trained.eos_id not in encode_texts(trained, [TEXTS[3]])[0]


def _abc_tokenizer() -> Tokenizer:
    """Byte-level BPE with merges (b c), (a b), (ab c): tiktoken's rule joins a|bc into abc, the
    merges never do."""
    vocab = {ch: b for ch, b in _byte_level_decoder().items()}
    vocab.update({"bc": 256, "ab": 257, "abc": 258})
    hf = HFTokenizer(models.BPE(vocab, [("b", "c"), ("a", "b"), ("ab", "c")]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([EOS_TOKEN])
    return Tokenizer(hf)


def test_a_merge_that_tiktokens_rule_would_skip_keeps_the_hf_tokenizer():
    tok = _abc_tokenizer()
    check = rank_table(tok)
    assert check.ranks is None and "abc" in check.reason
    assert rank_encoder(tok) is None
    import tiktoken

    from gptforge.data.rank_bpe import GPT2_PATTERN

    # Where the two rules differ: tiktoken would give the token abc, the merges a, bc.
    forced = tiktoken.Encoding(name="abc", pat_str=GPT2_PATTERN, mergeable_ranks=_ranks(tok), special_tokens={})
    assert forced.encode_ordinary("abc") == [258]
    assert tok.encode("abc") == [ord("a"), 256]
    assert encode_texts(tok, ["abc", "xabcx"]) == tok.encode_batch(["abc", "xabcx"])


def _ranks(tok: Tokenizer) -> dict[bytes, int]:
    from gptforge.data.tokenizer import token_bytes

    vocab = tok._hf.get_vocab(with_added_tokens=False)
    return {token_bytes(s): i for s, i in vocab.items()}  # type: ignore[misc]


def test_other_tokenizers_keep_the_hf_tokenizer(trained):
    hf = HFTokenizer.from_str(trained.to_str())
    hf.normalizer = normalizers.Lowercase()
    lowered = Tokenizer(hf)
    assert "normalizer" in rank_table(lowered).reason
    assert encode_texts(lowered, ["The River"]) == lowered.encode_batch(["The River"])
    hf = HFTokenizer.from_str(trained.to_str())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    spaced = Tokenizer(hf)
    assert "pre-tokenizer" in rank_table(spaced).reason
    assert encode_texts(spaced, ["river"]) == spaced.encode_batch(["river"])


def test_a_lone_surrogate_fails_as_with_the_hf_tokenizer(trained):
    with pytest.raises(TypeError):
        trained.encode_batch(["bad \ud800 text"])
    with pytest.raises(TypeError):
        encode_texts(trained, ["fine", "bad \ud800 text"])
