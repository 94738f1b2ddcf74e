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
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from gptforge.atomic import atomic_write_bytes

EOS_TOKEN = "<|endoftext|>"
MIN_VOCAB_SIZE = 257
"""The smallest vocabulary a trained tokenizer can have: the 256 byte tokens and <|endoftext|>."""
MAX_VOCAB_SIZE = 2**32
"""The largest: shards store token ids as uint32 at most."""
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
        if path.is_dir():
            inside = path / "tokenizer.json"
            raise FileNotFoundError(f"tokenizer file {str(path)!r} is a folder: give the tokenizer.json file"
                                    + (f" in it ({inside})" if inside.is_file() else ""))
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


# ---- vocabulary size for any script ---------------------------------------------------------

AUTO_VOCAB_MIN, AUTO_VOCAB_MAX = 512, 32768
#: the share of non-ASCII character occurrences whose characters the vocabulary must leave room
#: to merge into single tokens.
CHARACTER_COVERAGE = 0.999


def covering_merges(char_counts: Mapping[str, int], coverage: float = CHARACTER_COVERAGE) -> int:
    """Merges that would make the most frequent non-ASCII characters single tokens: the sum of
    (UTF-8 length - 1) over the fewest characters that cover `coverage` of the non-ASCII
    occurrences in `char_counts` (character -> occurrences). 0 for ASCII-only text; a Han
    character takes 2 (three bytes), so 1,300 covering Han characters need 2,600 merges."""
    counts = sorted(((n, c) for c, n in char_counts.items() if ord(c) > 127 and n > 0), reverse=True)
    total = sum(n for n, _ in counts)
    merges = covered = 0
    for n, c in counts:
        if covered >= coverage * total:
            break
        covered += n
        merges += len(c.encode("utf-8")) - 1
    return merges


def vocab_size_rule(n_bytes: int, char_counts: Mapping[str, int] | None = None, n_special: int = 1) -> int:
    """Vocabulary size for BPE training text of `n_bytes` UTF-8 bytes in any script.

    by_bytes = 4 * sqrt(n_bytes); by_characters = 2 * (256 + n_special + covering_merges(char_counts));
    target = max(by_bytes, min(by_characters, 2 * by_bytes)), rounded to the nearest power of two
    and clamped to [512, 32768].

    - The first term sizes the vocabulary by bytes, not characters, so that a byte of Chinese
      (a third of a character) weighs what a byte of English weighs; on ASCII text bytes are
      characters, so English keeps the sizes of the character rule it replaces (100 kB -> 1024,
      1 MB -> 4096, 16 MB -> 16384, 64 MB and more -> 32768). 4 * sqrt grows sublinearly, like
      the compute-optimal vocabularies of Tao et al. 2024 ("Scaling Laws with Vocabulary"), so
      every merge is still seen often.
    - The second term leaves room to merge the characters covering 99.9% of the non-ASCII
      occurrences into single tokens, and as many merges again for words: a few thousand
      distinct Han characters otherwise fill a small vocabulary with their byte pieces. It
      adds at most a factor of two to the first term, so that a small corpus with many
      distinct characters does not get a vocabulary its text cannot fill.

    Evidence (bench/vocab_rule.py, figures in bench/RESULTS.md): on 2.5 MB of Chinese technical
    prose (991 k characters), the old character rule gives 4096 (held-out 1.55 characters per
    token, 64% of the 1,292 covering characters single tokens), this rule 8192 (1.71, 78%), the
    same size it gives 2.5 MB of English.

    Args:
        n_bytes: UTF-8 bytes of the tokenizer's training text.
        char_counts: character -> occurrences in that text (None: the first term only).
        n_special: special tokens the vocabulary holds besides the 256 bytes.
    """
    import math

    target = by_bytes = 4.0 * math.sqrt(max(1, n_bytes))
    if char_counts:
        by_characters = 2.0 * (256 + n_special + covering_merges(char_counts))
        target = max(by_bytes, min(by_characters, 2.0 * by_bytes))
    return int(min(AUTO_VOCAB_MAX, max(AUTO_VOCAB_MIN, 2 ** round(math.log2(target)))))


# ---- readable vocabulary ------------------------------------------------------------------------


def _byte_level_decoder() -> dict[str, int]:
    """Byte-level BPE's character -> byte table (GPT-2): the printable bytes ! to ~, ¡ to ¬ and
    ® to ÿ stand for themselves; the other 68 bytes are U+0100 onwards, in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    others = [b for b in range(256) if b not in set(printable)]
    table.update({chr(0x100 + i): b for i, b in enumerate(others)})
    return table


def token_bytes(token: str) -> bytes | None:
    """The bytes a byte-level BPE token string stands for, or None when it is not one."""
    table = _BYTE_LEVEL
    try:
        return bytes(table[c] for c in token)
    except KeyError:
        return None


_BYTE_LEVEL = _byte_level_decoder()


def _show_bytes(raw: bytes) -> tuple[str, bool]:
    """(`raw` as text with every byte outside a whole UTF-8 character as <0xNN>, all whole?)."""
    parts: list[str] = []
    whole = True
    i = 0
    while i < len(raw):
        for n in (1, 2, 3, 4):
            try:
                ch = raw[i:i + n].decode("utf-8")
            except UnicodeDecodeError:
                continue
            parts.append(ch if ch.isprintable() or ch == " " else repr(ch)[1:-1])
            i += n
            break
        else:
            parts.append(f"<0x{raw[i]:02X}>")
            whole = False
            i += 1
    return "".join(parts), whole


def readable_vocab(tok: Tokenizer) -> list[dict]:
    """Every token of `tok` as {"id", "kind", "text"}, in id order.

    kind "special": an added special token, shown by name; "text": a token whose bytes are
    whole UTF-8 text, shown as that text (non-printable characters escaped as `repr` does:
    a newline shows as "\\n"; a space stays a space); "bytes": a token holding a piece of a
    multi-byte character, its whole characters shown as text and the other bytes as "<0xE4>"
    ("我们<0xE6>"). Tokenizers that are not byte-level show their token strings as they are.
    """
    hf = tok._hf
    special = {t.content for t in hf.get_added_tokens_decoder().values()}
    out = []
    for i in range(tok.vocab_size):
        s = hf.id_to_token(i)
        if s is None:
            continue
        if s in special:
            out.append({"id": i, "kind": "special", "text": s})
            continue
        raw = token_bytes(s)
        if raw is None:
            out.append({"id": i, "kind": "text", "text": s})
            continue
        text, whole = _show_bytes(raw)
        out.append({"id": i, "kind": "text" if whole else "bytes", "text": text})
    return out


def vocab_listing(path: str | Path, kinds: Sequence[str] = (), limit: int | None = None, as_json: bool = False) -> str:
    """The vocabulary of a tokenizer as text: one token a line, "ID<TAB>KIND<TAB>TEXT" after a
    summary line (tokens per kind), or JSON lines of `readable_vocab`'s dicts with `as_json`.

    Args:
        path: a tokenizer.json, or a folder holding one (a shard folder, an exported model).
        kinds: list only tokens of these kinds ("text", "bytes", "special"); () lists all.
        limit: list the first `limit` matching tokens only.

    Raises:
        FileNotFoundError: no tokenizer.json at `path`.
        ValueError: an unknown kind.
    """
    import json

    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {str(path)!r}: give the file, a shard folder or an exported "
                                "model folder")
    bad = set(kinds) - {"text", "bytes", "special"}
    if bad:
        raise ValueError(f"unknown token kind(s) {sorted(bad)}; known: text, bytes, special")
    rows = readable_vocab(Tokenizer.from_file(file))
    per_kind = {k: sum(r["kind"] == k for r in rows) for k in ("text", "bytes", "special")}
    shown = [r for r in rows if not kinds or r["kind"] in kinds][:limit]
    if as_json:
        return "\n".join(json.dumps(r, ensure_ascii=False) for r in shown)
    head = (f"{file}: {len(rows):,} tokens ({per_kind['text']:,} text, {per_kind['bytes']:,} with partial "
            f"characters as <0xNN> bytes, {per_kind['special']:,} special)")
    return "\n".join([head] + [f"{r['id']}\t{r['kind']}\t{r['text']}" for r in shown])
