"""`gptforge vocab TOKENIZER [--kind text|bytes|special ...] [--limit N] [--json]`: a readable vocabulary."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

# One description: `gptforge --help` lists SUMMARY (read from this file unimported); DESCRIPTION begins with it.
SUMMARY = "Print a tokenizer's vocabulary as text (byte pieces of characters shown as <0xNN>)."

DESCRIPTION = SUMMARY + """

Print a tokenizer's vocabulary, one token a line (id, kind, text): tokens as the text
they stand for, pieces of multi-byte characters (common with Chinese) with those bytes as <0xNN>,
special tokens by name. TOKENIZER is a tokenizer.json or a folder holding one (a prepare output
folder, an exported model)."""


@dataclass
class VocabOptions:
    tokenizer: str = ""
    """A tokenizer.json, or a folder holding one."""
    kind: list[Literal["text", "bytes", "special"]] = field(default_factory=list)
    """List only tokens of these kinds (default: all)."""
    limit: Optional[int] = None
    """List only the first N matching tokens."""
    json: bool = False
    """One JSON object a line ({"id", "kind", "text"}) instead of tab-separated columns."""


def main(argv: list[str]) -> int:
    from gptforge.data.tokenizer import vocab_listing
    from gptforge.options import command_parser, parse_command

    opts, _ = parse_command(command_parser("gptforge vocab", DESCRIPTION, VocabOptions, positional=("tokenizer",)),
                            argv)
    print(vocab_listing(opts.tokenizer, kinds=opts.kind, limit=opts.limit, as_json=opts.json))
    return 0
