"""Phase 3, tokenizer: the given tokenizer, or a byte-level BPE trained on the train split's text.

The sample is the train split's text after curation and dedup, in shard order, up to
`tokenizer_train_bytes` characters (`train_texts`); its vocabulary size, when not given, follows
its UTF-8 bytes and the characters covering 99.9% of its non-ASCII occurrences
(`gptforge.data.tokenizer.vocab_size_rule`, for any script). The trained tokenizer is kept in the work folder, so a
resumed run does not train it again.

Inputs: the work folder's curated shards and drop masks, `Splits`, the options. Output: the
tokenizer and the path of its file in the work folder (for the encode workers).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path

from gptforge.data.phases import encode
from gptforge.data.phases.split import Splits, cut_pieces
from gptforge.data.phases.work import WorkFolder
from gptforge.data.text_stats import whitespace_pieces
from gptforge.data.tokenizer import Tokenizer, train_bpe, vocab_size_rule

log = logging.getLogger("gptforge.data")


def train_texts(work: WorkFolder, masks: list, splits: Splits, max_chars: int) -> Iterator[str]:
    """Train-split texts in shard order, up to `max_chars` characters (0: all)."""
    used = 0
    cuts = splits.cuts
    for i, mask in enumerate(masks):
        for _, d in work.documents(i, mask):
            if d["key"] in cuts:
                texts = [t for split, t in cut_pieces(d["text"], cuts[d["key"]]) if split == "train"]
            elif splits.split_of(d["key"]) == "train":
                texts = [d["text"]]
            else:
                continue
            for text in texts:
                # Long texts in whitespace-cut pieces: the BPE trainer's pre-tokenization of one
                # huge string took ~80 bytes per character; the word counts are the same.
                for piece in whitespace_pieces(text, encode.TOKENIZE_PIECE_CHARS):
                    if max_chars and used >= max_chars:
                        return
                    used += len(piece)
                    yield piece


def check_vocab_size(vocab_size: int, n_bytes: int, char_counts: Mapping[str, int] | None = None) -> int:
    """The vocabulary size to train: `vocab_size`, or `tokenizer.vocab_size_rule(n_bytes,
    char_counts)` when it is 0 (logged). Logs a warning when an explicit size is more than 4x
    above or below the rule. `n_bytes`: UTF-8 bytes of the training text; `char_counts`: its
    character -> occurrences."""
    auto = vocab_size_rule(n_bytes, char_counts)
    if vocab_size == 0:
        chars = f" ({sum(char_counts.values()):,} characters)" if char_counts else ""
        log.info(f"vocabulary size {auto} chosen for {n_bytes:,} bytes{chars} of tokenizer training text "
                 "(set --vocab-size to override)")
        return auto
    if vocab_size > 4 * auto or 4 * vocab_size < auto:
        log.warning(f"--vocab-size {vocab_size} is far from the {auto} that fits {n_bytes:,} bytes of text "
                    f"(gptforge.data.tokenizer.vocab_size_rule); "
                    + ("many token types will be rare or unused" if vocab_size > auto else
                       "sequences will be long in tokens"))
    return vocab_size


def run_tokenizer(given: Tokenizer | None, work: WorkFolder, masks: list, splits: Splits, vocab_size: int,
                  min_frequency: int, max_chars: int, timings: dict[str, float]) -> tuple[Tokenizer, Path]:
    """Phase 3 (see the module docstring): (tokenizer, its file in the work folder)."""
    if given is not None:
        path = work.tokenizer_path(given=True)
        given.save(path)
        return given, path
    t = time.perf_counter()
    path = work.tokenizer_path(given=False)
    if path.exists():
        tokenizer = Tokenizer.from_file(path)
    else:
        # Sized for the bytes and characters the tokenizer is trained on (one counting pass).
        n_bytes, counts = 0, Counter()
        for piece in train_texts(work, masks, splits, max_chars):
            n_bytes += len(piece.encode("utf-8"))
            counts.update(piece)
        vocab = check_vocab_size(vocab_size, n_bytes, counts)
        tokenizer = train_bpe(train_texts(work, masks, splits, max_chars), vocab, min_frequency=min_frequency)
        tokenizer.save(path)
    timings["train_tokenizer"] = time.perf_counter() - t
    return tokenizer, path
