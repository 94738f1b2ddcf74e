"""`gptforge quantize RUN --method int8|int4|nf4 [--group-size 128] [--calibration DATA] --out RUN_Q`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal, Optional

# One description: `gptforge --help` lists SUMMARY (read from this file unimported); DESCRIPTION begins with it.
SUMMARY = "Quantize a run's weights to int8, int4 or nf4 and report size, speed and perplexity change."

DESCRIPTION = SUMMARY + """

Quantize a trained run's weights after training and write a new run that evaluate and
generate load. int8: every linear layer of the blocks per output channel (symmetric), with int8
activations computed dynamically on the CPU; int4: groups of --group-size inputs, asymmetric,
two weights per byte, fp16 scales and zero points; nf4: bitsandbytes' 4-bit NormalFloat.
Embeddings and the output head stay as they are unless --quantize-embeddings. Prints bytes,
bits per weight, validation perplexity before and after, and forward time. A quantized run
cannot be trained."""


@dataclass
class QuantizeOptions:
    run: str
    """Run directory or checkpoint folder to quantize."""
    out: str
    """Run directory to write."""
    method: Literal["int8", "int4", "nf4"] = "int8"
    """int8 (per output channel, dynamic int8 activations), int4 (group-wise, packed) or nf4."""
    group_size: int = 128
    """int4 / nf4: weights per scale (int4: along the input dimension, must divide each layer's
    input width; nf4: a power of two from 32 to 4096)."""
    calibration: Optional[str] = None
    """Shard folder whose val split measures perplexity before and after (default: the run's data)."""
    quantize_embeddings: bool = False
    """Also store the token embedding (int8 per row) and the output head (in --method) quantized."""
    max_eval_tokens: int = 32768
    """Tokens of the val split scored before and after."""
    overwrite: bool = False
    """Replace --out if it exists."""
    json: bool = False
    """Print the report as JSON."""
    quiet: bool = False
    """No progress bars (on a terminal) or progress lines (otherwise) on stderr."""


def main(argv: list[str]) -> int:
    from gptforge.options import command_parser, parse_command

    opts, _ = parse_command(command_parser("gptforge quantize", DESCRIPTION, QuantizeOptions, positional=("run",)),
                            argv)
    from gptforge.progress import set_quiet

    set_quiet(opts.quiet)
    from gptforge.export.quantize import format_report, quantize_run
    from gptforge.model.quant import QuantSpec

    spec = QuantSpec(method=opts.method, group_size=opts.group_size, quantize_embeddings=opts.quantize_embeddings)
    report = quantize_run(opts.run, spec, opts.out, opts.calibration, max_eval_tokens=opts.max_eval_tokens,
                          overwrite=opts.overwrite)
    print(json.dumps(report, indent=2) if opts.json else format_report(report) + f"\nwrote {opts.out}")
    return 0
