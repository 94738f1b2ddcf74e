"""Fixtures for the inference tests: a small byte-level BPE that splits multi-byte characters."""

from __future__ import annotations

import pytest

from gptforge.data.tokenizer import train_bpe
from tests.conftest import load_nano_run, train_nano_run

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


@pytest.fixture(scope="session")
def trained_run(tiny_shards, tmp_path_factory):
    """A run directory of a 2-layer GPT trained 40 steps on `tiny_shards` (vocab 384, block 64),
    so that its greedy choices are not near-ties."""
    return train_nano_run(tiny_shards, tmp_path_factory.mktemp("serve_run") / "run", min_lr=3e-4,
                          checkpoint_interval=40)


@pytest.fixture(scope="session")
def trained(trained_run):
    """(model in eval mode, Tokenizer) of `trained_run`."""
    return load_nano_run(trained_run)
