"""Grammar engines for structured output: llguidance against outlines-core, one run, same inputs.

    python bench/grammar_engines.py [--tokens 64] [--vocabs 2000 50000]

For each vocabulary size (a byte-level BPE trained here on the standard library's source, so no
download) and each engine: the time to compile a JSON schema (an object with a string, an integer
enum, a nested array of numbers and an optional boolean) into a matcher, and the mean time to
compute the allowed-token mask per generated token while a fixed valid JSON answer is fed token by
token (the work the serving engine adds per constrained row and step). Also prints each wheel's
installed size. llguidance computes masks lazily from an Earley parser over a lexer; outlines-core
compiles the schema to one regex and precomputes a DFA state x token index at compile time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from machine import cpu_description  # bench/machine.py

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40}, "level": {"type": "integer", "enum": [1, 2, 3]},
    "scores": {"type": "array", "items": {"type": "number"}, "maxItems": 8},
    "active": {"type": "boolean"}}, "required": ["name", "level", "scores"], "additionalProperties": False}
ANSWER = {"name": "Hamlet, prince of Denmark", "level": 2, "scores": [1.5, 22, -3.25, 1e3], "active": True}


def corpus() -> list[str]:
    """Python source of the standard library (about 20 MB), as training text."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    return [p.read_text(errors="replace") for p in sorted(root.rglob("*.py"))[:3000]]


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def bench_llguidance(tok, n_vocab: int, answer: list[int]) -> tuple[float, float]:
    import llguidance
    import llguidance.torch as lt

    t0 = time.perf_counter()
    lltok = llguidance.LLTokenizer(tok.to_str(), n_vocab=n_vocab, eos_token=tok.eos_id)
    t_tok = time.perf_counter() - t0
    t0 = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, overrides={"whitespace_flexible": False})
    m = llguidance.LLMatcher(lltok, grammar)
    t_compile = time.perf_counter() - t0
    assert not m.is_error(), m.get_error()
    mask = lt.allocate_token_bitmask(1, n_vocab)
    t0 = time.perf_counter()
    for t in answer:
        lt.fill_next_token_bitmask(m, mask)
        assert m.consume_token(t), m.get_error()
    per_token = (time.perf_counter() - t0) / len(answer)
    print(f"    llguidance tokenizer setup {t_tok * 1e3:.1f} ms")
    return t_compile, per_token


def bench_outlines(tok, n_vocab: int, answer: list[int]) -> tuple[float, float]:
    import outlines_core
    import torch
    from outlines_core.json_schema import build_regex_from_schema

    from gptforge.data.tokenizer import token_bytes

    vocab: dict[bytes, list[int]] = {}
    for i in range(tok.vocab_size):
        if i == tok.eos_id:
            continue
        raw = token_bytes(tok.id_to_token(i) or "")
        if raw:
            vocab.setdefault(raw, []).append(i)
    t0 = time.perf_counter()
    regex = build_regex_from_schema(json.dumps(SCHEMA), "")  # compact JSON, as llguidance above
    index = outlines_core.Index(regex, outlines_core.Vocabulary(tok.eos_id, vocab))
    guide = outlines_core.Guide(index)
    t_compile = time.perf_counter() - t0
    mask = torch.zeros((n_vocab + 31) // 32, dtype=torch.int32)
    t0 = time.perf_counter()
    for t in answer:
        guide.write_mask_into(mask.data_ptr(), mask.numel(), mask.element_size())
        guide.advance(t)
    per_token = (time.perf_counter() - t0) / len(answer)
    return t_compile, per_token


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocabs", type=int, nargs="+", default=[2000, 50000])
    args = ap.parse_args()
    import llguidance
    import outlines_core

    from gptforge.data.tokenizer import train_bpe

    print(f"machine: {cpu_description()}; load {os.getloadavg()[0]:.2f} at start")
    for mod in (llguidance, outlines_core):
        print(f"{mod.__name__}: installed size {dir_size(Path(mod.__file__).parent) / 2**20:.1f} MiB, "
              "no Python dependencies")
    texts = corpus()
    rows = []
    for v in args.vocabs:
        t0 = time.perf_counter()
        tok = train_bpe(texts, vocab_size=v, min_frequency=2)
        print(f"vocab {tok.vocab_size} trained in {time.perf_counter() - t0:.0f} s")
        answer = tok.encode(json.dumps(ANSWER, separators=(",", ":")))
        for name, fn in (("llguidance", bench_llguidance), ("outlines-core", bench_outlines)):
            c, p = fn(tok, tok.vocab_size, answer)
            rows.append((tok.vocab_size, name, c, p, len(answer)))
            print(f"  {name}: compile {c * 1e3:.1f} ms, mask {p * 1e6:.0f} us/token over {len(answer)} tokens "
                  f"(load {os.getloadavg()[0]:.2f})")
    print("\n| vocab | engine | compile ms | mask us/token |\n|---|---|---|---|")
    for v, name, c, p, _ in rows:
        print(f"| {v} | {name} | {c * 1e3:.1f} | {p * 1e6:.0f} |")


if __name__ == "__main__":
    main()
