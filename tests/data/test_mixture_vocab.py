"""A mixture's tokenizer is sized as one input of the same text would be (issue 41 item 1), and
`--tokenizer-train-bytes` counts UTF-8 bytes, as its name says, on both paths."""

from __future__ import annotations

import random

from gptforge.data.prepare import PrepareConfig, prepare
from gptforge.data.prepare_sources import prepare_sources
from gptforge.data.tokenizer import Tokenizer

EN_WORDS = ("the river city garden market school teacher children morning winter summer bridge station "
            "village farmer harvest letter window kitchen library museum walked found opened carried").split()


def _write(root, seed: int = 5):
    """English and Chinese folders: 30 English documents, 30 Chinese ones over ~1,500 Han
    characters with a Zipf-like frequency (so the vocabulary rule's character room matters)."""
    rng = random.Random(seed)
    han = [chr(0x4E00 + i) for i in range(1500)]
    weights = [1.0 / (i + 1) for i in range(len(han))]
    (root / "en").mkdir()
    (root / "zh").mkdir()
    for k in range(30):
        en = " ".join(" ".join(rng.choice(EN_WORDS) for _ in range(12)).capitalize() + "." for _ in range(40))
        (root / "en" / f"{k:02d}.txt").write_text(en, encoding="utf-8")
        zh = "".join("".join(rng.choices(han, weights, k=20)) + "。" for _ in range(60))
        (root / "zh" / f"{k:02d}.txt").write_text(zh, encoding="utf-8")


def test_mixture_gets_the_vocabulary_of_the_same_text_as_one_input(tmp_path):
    _write(tmp_path)
    common = dict(vocab_size=0, val_fraction=0.1, workers=1, recipe="none")
    one = prepare(PrepareConfig(inputs=[str(tmp_path / "en"), str(tmp_path / "zh")], out=str(tmp_path / "one"),
                                **common), show_progress=False)
    mix = prepare_sources(PrepareConfig(inputs=[], out=str(tmp_path / "mix"), **common),
                          {"en": [str(tmp_path / "en")], "zh": [str(tmp_path / "zh")]}, show_progress=False)
    assert one.meta["vocab_size"] >= 2048  # the character room for ~1,500 Han characters
    assert mix.meta["vocab_size"] == one.meta["vocab_size"]


def test_tokenizer_train_bytes_counts_bytes(tmp_path):
    """A 30 kB budget of Chinese text (3 bytes a character) is ~10 k characters, not 30 k."""
    _write(tmp_path)
    out = prepare(PrepareConfig(inputs=[str(tmp_path / "zh")], out=str(tmp_path / "zh_out"), vocab_size=600,
                                val_fraction=0.1, workers=1, recipe="none", tokenizer_train_bytes=30_000,
                                keep_work=True), show_progress=False)
    from gptforge.data.phases.tokenizer import SAMPLE_PHASE
    from gptforge.data.phases.work import WorkFolder

    work = WorkFolder.for_output(out.out_dir)
    stats = work.shard_stats(SAMPLE_PHASE, 0)
    assert 30_000 <= stats["bytes"] < 30_000 + 3 * 200
    # The mixture path: each source's budget is in bytes too.
    mix = prepare_sources(PrepareConfig(inputs=[], out=str(tmp_path / "mix"), vocab_size=600, val_fraction=0.1,
                                        workers=1, recipe="none", tokenizer_train_bytes=30_000),
                          {"en": [str(tmp_path / "en")], "zh": [str(tmp_path / "zh")]},
                          tokenizer_weights={"en": 0.0, "zh": 1.0}, show_progress=False)
    tok = Tokenizer.from_file(mix.out_dir / "tokenizer.json")
    assert tok.vocab_size == 600
