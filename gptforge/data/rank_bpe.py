"""Encode document text with tiktoken when it gives the ids the Hugging Face tokenizer gives.

prepare's encode phase spends its time in `tokenizers`' BPE; tiktoken encodes the same
byte-level BPE 3.5-4.6x faster per core (bench/RESULTS.md, "prepare per phase"). The two
differ in one rule: Hugging Face merges the adjacent pair of lowest *merge* rank, tiktoken the
adjacent pair whose concatenation is the token of lowest *token* rank. They agree when every
pair tiktoken may join is the merge that made that token. `rank_table` accepts a tokenizer only
when its file says so, checked on every token at load (`RankCheck`):

- GPT-2 byte-level BPE as `train_bpe` builds it: no normalizer, the ByteLevel pre-tokenizer with
  GPT-2's regex and no prefix space, a BPE model without dropout, unknown token, subword
  prefix/suffix, byte fallback or ignore_merges, no truncation or padding, only special added
  tokens (document text keeps
  their spellings as plain text, `Tokenizer.encode`);
- all 256 bytes are tokens, every other token is made by exactly one merge, and a merge's token
  ranks after both of its parts;
- every merge is what tiktoken's rule recovers on the token's own bytes from the tokens ranked
  before it (the condition under which a tiktoken table's merges are defined): a merge
  (ab, c) -> abc with bc ranked before ab would fail it, as tiktoken would join a|bc.

The last check is necessary, not proven sufficient for every input; the evidence of identity
is bench/RESULTS.md's: the same ids on the whole English and Chinese bench corpora, on every
token's own text, on 560,000 random concatenations of 2-4 tokens and on every Unicode code point
in 14 contexts, and `tests/data/test_rank_bpe.py`. Any other tokenizer, a text with a lone
surrogate, or tiktoken not installed: the Hugging Face tokenizer, as before.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gptforge.data.tokenizer import Tokenizer, token_bytes

#: GPT-2's pre-tokenization regex, as `tokenizers`' ByteLevel pre-tokenizer applies it.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@dataclass
class RankCheck:
    """The outcome of `rank_table`: `ranks` (token bytes -> id) when tiktoken gives the same ids,
    else None and `reason` (the first failed condition, naming the token or option)."""

    ranks: dict[bytes, int] | None
    reason: str


def _rank_merge(word: bytes, ranks: dict[bytes, int], below: int) -> list[bytes]:
    """tiktoken's rule on `word` with the tokens ranked below `below`: join the adjacent pair whose
    concatenation ranks lowest (leftmost on ties) until none is a token."""
    parts = [word[i:i + 1] for i in range(len(word))]
    while len(parts) > 1:
        best, at = below, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best:
                best, at = r, i
        if at < 0:
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return parts


def _config_reason(cfg: dict[str, Any]) -> str:
    """Why a tokenizer.json is not plain GPT-2 byte-level BPE ("" when it is)."""
    model = cfg.get("model") or {}
    pre = cfg.get("pre_tokenizer") or {}
    if cfg.get("normalizer") is not None:
        return "it has a normalizer"
    if cfg.get("truncation") is not None or cfg.get("padding") is not None:
        return "it truncates or pads"
    if pre.get("type") != "ByteLevel" or pre.get("add_prefix_space") or not pre.get("use_regex", True):
        return f"its pre-tokenizer is not ByteLevel with GPT-2's regex and no prefix space ({pre.get('type')})"
    if model.get("type") != "BPE":
        return f"its model is {model.get('type')}, not BPE"
    for key in ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            return f"its BPE model sets {key}"
    if model.get("byte_fallback") or model.get("ignore_merges") or model.get("fuse_unk"):
        return "its BPE model sets byte_fallback, ignore_merges or fuse_unk"
    for t in cfg.get("added_tokens") or []:
        if not t.get("special"):
            return f"added token {t.get('content')!r} is not special"
    return ""


def rank_table(tokenizer: Tokenizer) -> RankCheck:
    """tiktoken's rank table for `tokenizer` when its encoding is the same (module docstring)."""
    cfg = json.loads(tokenizer.to_str())
    reason = _config_reason(cfg)
    if reason:
        return RankCheck(None, reason)
    added = {t["content"] for t in cfg.get("added_tokens") or []}
    ranks: dict[bytes, int] = {}
    for s, i in cfg["model"]["vocab"].items():
        if s in added:
            continue
        b = token_bytes(s)
        if b is None:
            return RankCheck(None, f"token {s!r} is not a byte-level token")
        ranks[b] = i
    if len(set(ranks.values())) != len(ranks):
        return RankCheck(None, "two tokens share an id")
    if any(bytes([b]) not in ranks for b in range(256)):
        return RankCheck(None, "not every byte is a token")
    made: set[bytes] = set()
    for m in cfg["model"]["merges"]:
        a_s, b_s = m.split(" ") if isinstance(m, str) else m
        a, b = token_bytes(a_s), token_bytes(b_s)
        if a is None or b is None or a + b not in ranks:
            return RankCheck(None, f"merge {a_s!r} {b_s!r} does not make a byte-level token of the vocabulary")
        t = a + b
        if t in made:
            return RankCheck(None, f"token {t!r} is made by two merges")
        made.add(t)
        if not ranks[t] > max(ranks[a], ranks[b]):
            return RankCheck(None, f"merge {a_s!r} {b_s!r} ranks its token before a part")
        if _rank_merge(t, ranks, ranks[t]) != [a, b]:
            return RankCheck(None, f"tiktoken's rule splits token {t!r} otherwise than its merge {a_s!r} {b_s!r}")
    missing = [t for t in ranks if len(t) > 1 and t not in made]
    if missing:
        return RankCheck(None, f"token {missing[0]!r} is made by no merge")
    return RankCheck(ranks, "")


_ENCODERS: dict[str, Any] = {}  # tokenizer sha256 -> tiktoken Encoding, or None (not eligible)


def rank_encoder(tokenizer: Tokenizer) -> Any:
    """A tiktoken `Encoding` that gives `tokenizer.encode`'s ids, or None (ineligible, or tiktoken
    missing). Checked once per tokenizer and process (~0.1 s per 10,000 merges)."""
    key = tokenizer.sha256
    if key not in _ENCODERS:
        try:
            import tiktoken
        except ImportError:
            _ENCODERS[key] = None
            return None
        check = rank_table(tokenizer)
        _ENCODERS[key] = None if check.ranks is None else tiktoken.Encoding(
            name=f"gptforge-{key[:12]}", pat_str=GPT2_PATTERN, mergeable_ranks=check.ranks, special_tokens={})
    return _ENCODERS[key]


def encode_texts(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """`tokenizer.encode_batch(texts)`'s ids, through tiktoken when `rank_encoder` allows it.

    A text that is not valid Unicode (a lone surrogate) goes to `tokenizer.encode_batch` with
    the rest, which raises as it always did (tiktoken would replace the surrogate instead).
    """
    enc = rank_encoder(tokenizer)
    if enc is None:
        return tokenizer.encode_batch(texts)
    try:
        for t in texts:
            t.encode("utf-8")
    except UnicodeEncodeError:
        return tokenizer.encode_batch(texts)
    return [enc.encode_ordinary(t) for t in texts]
