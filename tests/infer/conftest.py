"""Fixtures for the inference tests: a small byte-level BPE that splits multi-byte characters."""

from __future__ import annotations

import pytest

from gptforge.data.tokenizer import train_bpe

# Chinese, emoji with skin-tone modifiers and ZWJ sequences, Greek, Cyrillic, Arabic, Devanagari.
MIXED = ("你好，世界。我们测试中文的流式输出。👍🏽 👋🏿 👩🏾‍💻 🇯🇵 café naïve Ελληνικά русский текст "
         "مرحبا بالعالم नमस्ते दुनिया 😀😃😄 end.")


@pytest.fixture(scope="session")
def byte_tokenizer():
    """A 300-token byte-level BPE trained on a little English and the mixed-script text: most
    non-ASCII characters stay split across two or more byte tokens."""
    from pathlib import Path

    import gptforge

    english = Path(gptforge.__file__).read_text()
    return train_bpe([english] * 3 + [MIXED], vocab_size=300, min_frequency=2)
