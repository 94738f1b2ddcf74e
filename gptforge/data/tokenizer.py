"""Byte-level BPE tokenizer: a thin wrapper around Hugging Face `tokenizers`.

Byte-level means the base alphabet is the 256 byte values (GPT-2, Radford et al. 2019, section
2.2): any Unicode string, Chinese and emoji included, encodes without an unknown token and
decodes back exactly. Pre-tokenization uses GPT-2's regex; no normalizer runs inside the
tokenizer (prepare normalizes documents once, before they get here), so `decode(encode(s)) == s`
for every string `s`.

Two encode paths:

- `encode(text)` / `encode_batch(texts)`: document text. A literal "<|endoftext|>" (or any other
  special token's spelling) inside the text is encoded as the plain characters it is made of,
  never as the special id, so a document cannot forge a document boundary.
- `encode_template(parts)`: for templates (chat formats): strings are encoded as plain text as
  above, ints are special-token ids inserted as they are.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from gptforge.atomic import atomic_write_bytes

EOS_TOKEN = "<|endoftext|>"
EOS_CANDIDATES = (EOS_TOKEN, "</s>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>")


def _default_eos(hf: _HFTokenizer, config_file: Path) -> str:
    """The end-of-text token of a tokenizer: EOS_TOKEN when it has one (gptforge's own and GPT-2 /
    Qwen tokenizers: the document separator of pretraining), else tokenizer_config.json's
    eos_token when it names a token of the vocabulary, else the first of EOS_CANDIDATES present
    (else EOS_TOKEN, which the constructor then reports as missing)."""
    import json

    if hf.token_to_id(EOS_TOKEN) is not None:
        return EOS_TOKEN
    if config_file.is_file():
        try:
            eos = json.loads(config_file.read_text()).get("eos_token")
        except (ValueError, AttributeError):
            eos = None
        if isinstance(eos, dict):
            eos = eos.get("content")
        if isinstance(eos, str) and hf.token_to_id(eos) is not None:
            return eos
    return next((t for t in EOS_CANDIDATES if hf.token_to_id(t) is not None), EOS_TOKEN)


class Tokenizer:
    """A byte-level BPE tokenizer with an end-of-text special token.

    Attributes:
        vocab_size: number of token ids (including special tokens); ids are in [0, vocab_size).
        eos_id: id of `<|endoftext|>`, appended after every document.
        sha256: hex SHA-256 of the tokenizer's JSON serialization (the exact bytes `save`
            writes), identifying it in shard metadata and checkpoints.
    """

    def __init__(self, hf: _HFTokenizer, eos_token: str = EOS_TOKEN):
        eos = hf.token_to_id(eos_token)
        if eos is None:
            raise ValueError(f"tokenizer has no {eos_token!r} token; train it with gptforge or add that special token")
        # Special-token spellings in text are plain text; templates insert special ids explicitly.
        hf.encode_special_tokens = True
        self._hf = hf
        self.eos_token = eos_token
        self.eos_id: int = eos
        self.vocab_size: int = hf.get_vocab_size(with_added_tokens=True)
        self._json = hf.to_str()
        self.sha256: str = hashlib.sha256(self._json.encode("utf-8")).hexdigest()

    # ---- construction -----------------------------------------------------------------------

    @classmethod
    def from_file(cls, path: str | Path, eos_token: str | None = None) -> Tokenizer:
        """Load a Hugging Face `tokenizer.json`.

        eos_token: the end-of-text token. Default: `<|endoftext|>` when present, else the
        `eos_token` of a tokenizer_config.json beside the file (Hugging Face model folders, e.g.
        "</s>", "<|end_of_text|>"), else the first of `EOS_CANDIDATES` in the vocabulary.

        Raises:
            FileNotFoundError: `path` does not exist.
            ValueError: the file is not a tokenizer or has no end-of-text token.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file {str(path)!r} does not exist")
        try:
            hf = _HFTokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
            raise ValueError(f"{path}: not a Hugging Face tokenizer.json ({e})") from e
        return cls(hf, eos_token or _default_eos(hf, path.parent / "tokenizer_config.json"))

    @classmethod
    def from_str(cls, json_text: str) -> Tokenizer:
        """Build from a tokenizer.json string (as `to_str` returns)."""
        return cls(_HFTokenizer.from_str(json_text))

    def to_str(self) -> str:
        """The tokenizer.json text (what `save` writes, what `sha256` hashes)."""
        return self._json

    def save(self, path: str | Path) -> None:
        """Write tokenizer.json atomically (temp file in the same folder, fsync, rename)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, self._json.encode("utf-8"))

    # ---- encoding ---------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of document text; special-token spellings in it are plain text. No EOS added."""
        return self._hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` for many texts at once (parallel in Rust unless TOKENIZERS_PARALLELISM=false)."""
        # encode_batch_fast skips character offsets, which we never use (~1.4x faster).
        fast = getattr(self._hf, "encode_batch_fast", None) or self._hf.encode_batch
        return [e.ids for e in fast(list(texts), add_special_tokens=False)]

    def encode_template(self, parts: Iterable[str | int]) -> list[int]:
        """Encode a template: strings as plain text (like `encode`), ints as special-token ids.

        Raises:
            ValueError: an int outside [0, vocab_size).
            TypeError: a part that is neither str nor int.
        """
        ids: list[int] = []
        for part in parts:
            if isinstance(part, bool) or not isinstance(part, (str, int)):
                raise TypeError(f"template parts are str (text) or int (token id), got {type(part).__name__}")
            if isinstance(part, int):
                if not 0 <= part < self.vocab_size:
                    raise ValueError(f"token id {part} outside the vocabulary [0, {self.vocab_size})")
                ids.append(part)
            elif part:
                ids.extend(self.encode(part))
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`; special tokens are written out by name (e.g. "<|endoftext|>")."""
        return self._hf.decode(list(ids), skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        """Id of a token string (e.g. a special token), or None when absent."""
        return self._hf.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._hf.id_to_token(token_id)

    def __getstate__(self) -> dict:
        return {"json": self._json, "eos_token": self.eos_token}

    def __setstate__(self, state: dict) -> None:
        self.__init__(_HFTokenizer.from_str(state["json"]), state["eos_token"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, eos_id={self.eos_id}, sha256={self.sha256[:12]}...)"


def train_bpe(texts: Iterable[str], vocab_size: int = 32000, *, min_frequency: int = 2,
              special_tokens: Sequence[str] = (EOS_TOKEN,), show_progress: bool = False,
              length: int | None = None) -> Tokenizer:
    """Train a byte-level BPE on a stream of texts (streamed; memory grows with distinct words).

    Args:
        texts: document texts; consumed once.
        vocab_size: target vocabulary size including the 256 byte tokens and special tokens;
            a small corpus may stop with fewer (no pair left with `min_frequency`).
        min_frequency: a pair must occur this often to be merged.
        special_tokens: extra special tokens; `<|endoftext|>` is always included, first (id 0).
        length: number of texts, if known (for the progress display only).

    Raises:
        ValueError: vocab_size too small to hold the byte alphabet and special tokens.
    """
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    special_tokens = [EOS_TOKEN] + [t for t in special_tokens if t != EOS_TOKEN]
    if vocab_size < len(alphabet) + len(special_tokens):
        raise ValueError(f"vocab_size {vocab_size} is below the minimum {len(alphabet) + len(special_tokens)} "
                         f"(256 byte tokens + {len(special_tokens)} special)")
    hf = _HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=list(special_tokens), initial_alphabet=alphabet,
                                  show_progress=show_progress)
    hf.train_from_iterator(texts, trainer, length=length)
    return Tokenizer(hf)
