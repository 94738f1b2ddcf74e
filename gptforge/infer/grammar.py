"""Grammar-constrained decoding: a per-request token matcher that masks the logits of one row.

Structured output (a JSON schema, any JSON object, a regular expression, a choice of strings, a
Lark or GBNF grammar) is compiled by llguidance (Microsoft's grammar engine: an Earley parser over
a lazily built lexer, masks computed per step with no precomputed state x token table) into one
grammar string (`compile_grammar`). A request carries that string in its sampling parameters; the
engine starts one `Constraint` per request from it, so constrained and free requests share a batch:
before each sample the constraint sets the logits of every token the grammar forbids to -inf, and
after it the constraint advances its matcher by the sampled token. Tokens are matched as bytes, so
a multi-byte character split over several byte-level tokens (Chinese, emoji) is handled.

Why llguidance and not outlines-core (bench/grammar_engines.py, figures in bench/RESULTS.md):
both install as one wheel with no Python dependencies (7.5 and 5.2 MiB); llguidance compiles a
schema in about 2 ms at any vocabulary size where outlines-core's state x token index took 5 s
on a 50k vocabulary, its masks cost about the same per token, and it takes context-free grammars
(the `grammar` field) and recursive schemas, which a regular expression cannot express.

JSON is compact: no whitespace outside strings (`","` and `":"` separators), since a small model
allowed free whitespace pads with newlines until max_tokens instead of closing the object.

Compilation is bounded: a schema, regex or grammar longer than MAX_SPEC_CHARS, beyond llguidance's
work and size limits (`limits()`), or taking over COMPILE_TIMEOUT_S to compile and compute its first
mask is refused with a `GrammarError` naming the request field, as is one that does not compile.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

import torch

MAX_SPEC_CHARS = 32_768
"""Longest schema (as JSON), regex, grammar or joined choice list accepted, in characters."""

COMPILE_TIMEOUT_S = 2.0
"""Seconds a constraint may take to compile and compute its first mask (`check_grammar`)."""

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
"""llguidance JSON compile options: compact JSON only (see the module docstring)."""


def limits():
    """llguidance's parser limits for every grammar here (see the module docstring)."""
    import llguidance

    return llguidance.LLParserLimits(max_grammar_size=100_000, initial_lexer_fuel=1_000_000,
                                     step_lexer_fuel=200_000, step_max_items=50_000, max_lexer_states=50_000)


class GrammarError(ValueError):
    """A constraint that cannot be compiled; `field` names the request field it came from."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


class GrammarVocab:
    """The tokenizer as llguidance sees it, built once on first use (about 1 s for 50k tokens).

    Args:
        tokenizer_json: the Hugging Face tokenizers JSON (gptforge's `Tokenizer.to_str()`).
        n_vocab: the model's vocabulary (logits width, may exceed the tokenizer's: padded ids
            are never allowed).
        eos_id: the end-of-text id (allowed once the grammar accepts).
    """

    def __init__(self, tokenizer_json: str, n_vocab: int, eos_id: int):
        self.tokenizer_json, self.n_vocab, self.eos_id = tokenizer_json, n_vocab, eos_id
        self._lock = threading.Lock()
        self._tok: Any = None

    @property
    def tokenizer(self):
        """The llguidance LLTokenizer."""
        with self._lock:
            if self._tok is None:
                import llguidance

                self._tok = llguidance.LLTokenizer(self.tokenizer_json, n_vocab=self.n_vocab, eos_token=self.eos_id)
            return self._tok

    def matcher(self, grammar: str, field: str = "grammar"):
        """A fresh llguidance LLMatcher of `grammar` (from `compile_grammar`).

        Raises:
            GrammarError: the grammar does not compile within `limits()` (naming `field`).
        """
        import llguidance

        m = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0, limits=limits())
        if m.is_error():
            raise GrammarError(field, _first_line(m.get_error()))
        return m


def _first_line(message: str) -> str:
    """llguidance's message on one line (at most 400 characters), without its source excerpts."""
    import re

    lines = [x.strip() for x in message.strip().splitlines()]
    lines = [x for x in lines if x and not re.fullmatch(r"\^+|\d+ \|.*", x)]
    return " ".join(lines)[:400] or "does not compile"


def _check_size(field: str, text: str) -> None:
    if len(text) > MAX_SPEC_CHARS:
        raise GrammarError(field, f"is {len(text)} characters long; at most {MAX_SPEC_CHARS} are accepted")


def json_schema_grammar(schema: Any, field: str) -> str:
    """The grammar of compact JSON text valid under JSON schema `schema` (a dict).

    Raises:
        GrammarError: `schema` is not a JSON object, is too long, or is not a schema llguidance takes.
    """
    import llguidance

    if not isinstance(schema, dict):
        raise GrammarError(field, f"must be a JSON schema object, got {type(schema).__name__}")
    text = json.dumps(schema, ensure_ascii=False)
    _check_size(field, text)
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(text, overrides=JSON_OPTIONS)  # type: ignore[arg-type]
    except ValueError as e:
        raise GrammarError(field, _first_line(str(e))) from None


def any_json_object_grammar() -> str:
    """The grammar of any compact JSON object (`response_format: {"type": "json_object"}`)."""
    return json_schema_grammar({"type": "object"}, "response_format")


def regex_grammar(regex: str, field: str) -> str:
    """The grammar of text matching `regex` in full (Rust `regex` syntax, as vLLM's engines take)."""
    import llguidance

    _check_size(field, regex)
    return llguidance.LLMatcher.grammar_from_regex(regex)


def choice_grammar(choices: Sequence[str], field: str) -> str:
    """The grammar of exactly one of `choices` (literal strings)."""
    import re

    if not choices:
        raise GrammarError(field, "is empty: give at least one string")
    _check_size(field, "".join(choices))
    return regex_grammar("(" + "|".join(re.escape(c) for c in choices) + ")", field)


def lark_grammar(grammar: str, field: str) -> str:
    """The grammar of a Lark grammar (llguidance's dialect; `start` is the start rule), or of a
    GBNF grammar (llama.cpp's format, recognised by `::=`; `root` is its start rule)."""
    import llguidance

    _check_size(field, grammar)
    if "::=" in grammar:
        from llguidance.gbnf_to_lark import gbnf_to_lark

        try:
            grammar = gbnf_to_lark(grammar)
        except Exception as e:  # noqa: BLE001 - the converter raises plain exceptions on bad input
            raise GrammarError(field, f"is not valid GBNF: {_first_line(str(e))}") from None
    return llguidance.LLMatcher.grammar_from_lark(grammar)


def check_grammar(vocab: GrammarVocab, grammar: str, field: str, timeout_s: float = COMPILE_TIMEOUT_S) -> None:
    """Compile `grammar` against `vocab` under `limits()`, compute its first mask, as the engine
    will, and follow the first token it allows, in a worker thread given `timeout_s` seconds (llguidance's work limits bound the parser,
    not the time to build a lexer for a regex like `(a{1000}){1000}`: seconds; the worker runs on
    outside the interpreter lock until it finishes, and its result is dropped).

    Raises:
        GrammarError: it does not compile, exceeds `limits()` or takes over `timeout_s` (naming `field`).
    """
    import llguidance

    message = llguidance.LLMatcher.validate_grammar(grammar, vocab.tokenizer, limits=limits())
    if message:
        raise GrammarError(field, _first_line(message))
    errors: list[GrammarError] = []

    def work() -> None:
        try:
            c = Constraint(vocab, grammar, field)
            first = c.allowed().nonzero().flatten()
            # One token in, too: a lexer that outgrows its limits on the first byte (the regex above
            # once its first mask is built) fails here, naming the field, rather than in the engine.
            if first.numel() and not c.matcher.consume_token(int(first[0])):
                raise GrammarError(field, _first_line(c.matcher.get_error()))
        except GrammarError as e:
            errors.append(e)

    worker = threading.Thread(target=work, name="gptforge-grammar-check", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise GrammarError(field, f"took more than {timeout_s:g} s to compile; simplify it")
    if errors:
        raise errors[0]


class Constraint:
    """One request's matcher: masks its logits (V,) and follows its sampled tokens.

    After a token the grammar has ended (`done`: nothing but the end may follow), the engine ends
    the sequence with finish_reason "stop"; a grammar that accepts but may continue (a regex like
    `a+`) lets the model choose the end-of-text or a stop token id.
    """

    def __init__(self, vocab: GrammarVocab, grammar: str, field: str = "grammar"):
        self.vocab = vocab
        self.matcher = vocab.matcher(grammar, field)
        self.words = (vocab.n_vocab + 31) // 32
        self._shifts = torch.arange(8, dtype=torch.uint8)

    def allowed(self) -> torch.Tensor:
        """(n_vocab,) bool: the tokens the grammar allows next."""
        bits = torch.zeros(self.words, dtype=torch.int32)
        self.matcher.unsafe_compute_mask_ptr(bits.data_ptr(), self.words * 4)
        by = bits.view(torch.uint8)  # little-endian words: bit j of byte k is token 8k + j
        return ((by[:, None] >> self._shifts) & 1).flatten()[: self.vocab.n_vocab].bool()

    def mask(self, logits: torch.Tensor, stop_token_ids: Sequence[int]) -> torch.Tensor:
        """`logits` (V,) with the forbidden tokens at -inf; the request's stop ids are allowed
        wherever the end-of-text is (the grammar accepts).

        Raises:
            RuntimeError: the matcher is in an error state or allows no token at all.
        """
        if self.matcher.is_error():
            raise RuntimeError(f"grammar matcher failed: {_first_line(self.matcher.get_error())}")
        allowed = self.allowed().to(logits.device)
        if bool(allowed[self.vocab.eos_id]):
            for t in stop_token_ids:
                if 0 <= t < allowed.numel():
                    allowed[t] = True
        if not bool(allowed.any()):
            raise RuntimeError("the grammar allows no token here")
        return logits.masked_fill(~allowed[: logits.numel()], float("-inf"))

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading `tokens` the grammar allows in a row from its current state (which it
        keeps): a speculative draft is cut there (`gptforge.infer.speculative`)."""
        if not tokens or self.matcher.is_error():
            return 0
        return int(self.matcher.validate_tokens(list(tokens)))

    def advance(self, token_id: int) -> bool:
        """Follow the sampled `token_id`; True when the grammar has ended after it.

        Raises:
            RuntimeError: the grammar does not allow the token.
        """
        if not self.matcher.consume_token(token_id):
            raise RuntimeError(f"grammar matcher refused token {token_id}: {_first_line(self.matcher.get_error())}")
        return bool(self.matcher.is_stopped())
