"""Phase 3, tokenizer: the given tokenizer, or a byte-level BPE trained on the train split's text.

The sample is the train split's text after curation and dedup, in shard order, up to
`tokenizer_train_bytes` characters (`train_texts`); its vocabulary size, when not given, follows
the corpus size (`auto_vocab_size`). The trained tokenizer is kept in the work folder, so a
resumed run does not train it again.

Inputs: the work folder's curated shards and drop masks, `Splits`, the options. Output: the
tokenizer and the path of its file in the work folder (for the encode workers).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

from gptforge.data.phases import encode
from gptforge.data.phases.split import Splits, cut_pieces
from gptforge.data.phases.work import WorkFolder
from gptforge.data.text_stats import whitespace_pieces
from gptforge.data.tokenizer import Tokenizer, train_bpe

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


AUTO_VOCAB_MIN, AUTO_VOCAB_MAX = 512, 32768


def auto_vocab_size(n_chars: int) -> int:
    """Vocabulary size for a corpus of `n_chars` characters (after normalization) when
    --vocab-size is not given: 4 * sqrt(n_chars) rounded to the nearest power of two, clamped to
    [512, 32768]. 100 kB -> 1024, 1 MB -> 4096, 16 MB -> 16384, 64 MB and more -> 32768.

    A heuristic (gptforge's, not from a paper): the vocabulary grows sublinearly with the data,
    as the compute-optimal vocabularies of Tao et al. 2024 ("Scaling Laws with Vocabulary") do, so
    that each merge is still seen often (a 4096-token vocabulary over 1 MB of text leaves ~70
    occurrences per token type) rather than 32000 types over a few MB.
    """
    import math

    target = 4.0 * math.sqrt(max(1, n_chars))
    return int(min(AUTO_VOCAB_MAX, max(AUTO_VOCAB_MIN, 2 ** round(math.log2(target)))))


def check_vocab_size(vocab_size: int, n_chars: int) -> int:
    """The vocabulary size to train: `vocab_size`, or `auto_vocab_size(n_chars)` when it is 0
    (logged). Logs a warning when an explicit size is more than 4x above or below the rule."""
    auto = auto_vocab_size(n_chars)
    if vocab_size == 0:
        log.info(f"vocabulary size {auto} chosen for {n_chars:,} characters of tokenizer training text "
                 "(set --vocab-size to override)")
        return auto
    if vocab_size > 4 * auto or 4 * vocab_size < auto:
        log.warning(f"--vocab-size {vocab_size} is far from the {auto} that fits {n_chars:,} characters of text "
                    f"(gptforge.data.phases.tokenizer.auto_vocab_size); "
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
        # Sized for the characters the tokenizer is trained on (one counting pass).
        train_chars = sum(len(p) for p in train_texts(work, masks, splits, max_chars))
        vocab = check_vocab_size(vocab_size, train_chars)
        tokenizer = train_bpe(train_texts(work, masks, splits, max_chars), vocab, min_frequency=min_frequency)
        tokenizer.save(path)
    timings["train_tokenizer"] = time.perf_counter() - t
    return tokenizer, path
