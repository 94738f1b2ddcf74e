"""Shared fixtures for the data-stage tests: small real text and a small trained tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from gptforge.data.stdlib_corpus import stdlib_files
from gptforge.data.tokenizer import train_bpe


@pytest.fixture(scope="session")
def stdlib_texts() -> list[str]:
    """About 40 real documents: the text of small standard-library modules (docstrings included)."""
    texts = []
    for path in stdlib_files():
        size = path.stat().st_size
        if 2_000 < size < 12_000:
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
        if len(texts) == 40:
            break
    assert len(texts) == 40
    return texts


@pytest.fixture(scope="session")
def small_tokenizer(stdlib_texts):
    """A byte-level BPE with a 512-token vocabulary trained on `stdlib_texts`."""
    extra = ["你好，世界。我们测试中文。", "emoji 🎉🚀 ok", "Ελληνικά και русский текст"] * 5
    return train_bpe(stdlib_texts + extra, vocab_size=512)


#: the project's shared Chinese guides, beside the repository (never copied into it).
ZH_GUIDES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "zh_guides"


@pytest.fixture(scope="session")
def zh_guides() -> list[str]:
    """The texts of the two Chinese guides in ../shared/data/zh_guides (skips when absent)."""
    files = sorted(ZH_GUIDES.glob("*.txt")) if ZH_GUIDES.is_dir() else []
    if not files:
        pytest.skip(f"the Chinese guides are not at {ZH_GUIDES}")
    return [f.read_text(encoding="utf-8") for f in files]
