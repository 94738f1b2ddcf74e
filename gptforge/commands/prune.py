"""`gptforge prune RUN (--target-params N | --heads-per-layer H --d-ff F --n-layer L --d-model D)
--calibration DATA --out RUN_P`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

# One description: `gptforge --help` lists SUMMARY (read from this file unimported); DESCRIPTION begins with it.
SUMMARY = "Prune a run's heads, MLP channels, embedding channels and layers by activation importance."

DESCRIPTION = SUMMARY + """

Make a trained run smaller by removing whole structures: attention heads (GQA groups kept
intact), MLP channels, embedding channels and layers, ranked by the activations they produce on
calibration data (Minitron, arXiv 2407.14679 / 2408.11796, section 2). Writes an ordinary run that
evaluate, generate and finetune use; distil or fine-tune it to recover quality. --sparsity
instead zeroes the smallest-magnitude weights (unstructured; the run stays as large)."""


@dataclass
class PruneOptions:
    run: str
    """Run directory or checkpoint folder to prune."""
    out: str
    """Run directory to write."""
    calibration: Optional[str] = None
    """Shard folder (`gptforge prepare`) whose tokens rank the structures (structured pruning)."""
    target_params: Optional[int] = None
    """Prune heads, MLP and embedding channels by one common factor to at most this many parameters
    (layers kept). Excludes the explicit shape options."""
    heads_per_layer: Optional[int] = None
    """Query heads kept per layer: a multiple of n_kv_head (fewer heads per GQA group) or of the
    group size (fewer groups)."""
    d_ff: Optional[int] = None
    """MLP channels kept per layer."""
    n_layer: Optional[int] = None
    """Layers kept (the least important blocks are removed)."""
    d_model: Optional[int] = None
    """Embedding channels kept."""
    sparsity: Optional[float] = None
    """Instead of structures: zero this fraction of the blocks' linear weights with the smallest
    magnitude (unstructured). The weights stay dense: no smaller file and no speed-up without
    sparse kernels. Excludes the other pruning options; needs no --calibration."""
    calibration_split: str = "train"
    """Split of --calibration to read."""
    calibration_batch_size: int = 4
    """Sequences (of block_size tokens) per calibration batch."""
    calibration_batches: int = 16
    """Calibration batches (at most; fewer if the split is shorter)."""
    overwrite: bool = False
    """Replace --out if it exists."""
    json: bool = False
    """Print the report as JSON."""
    quiet: bool = False
    """No progress bars (on a terminal) or progress lines (otherwise) on stderr."""


def main(argv: list[str]) -> int:
    from gptforge.options import command_parser, parse_command

    o, _ = parse_command(command_parser("gptforge prune", DESCRIPTION, PruneOptions, positional=("run",)), argv)
    from gptforge.progress import set_quiet

    set_quiet(o.quiet)
    from gptforge.errors import InputError
    from gptforge.export.prune import PruneShape, prune_run

    explicit = [o.heads_per_layer, o.d_ff, o.n_layer, o.d_model]
    if o.sparsity is not None:
        if o.target_params is not None or any(v is not None for v in explicit):
            raise InputError("--sparsity excludes --target-params and the shape options: give one kind of pruning")
        from gptforge.export.prune import sparsify_run

        r = sparsify_run(o.run, o.out, o.sparsity, overwrite=o.overwrite)
        print(json.dumps(r, indent=2) if o.json else
              f"zeroed {r['zeros_in_block_linears']:.1%} of the block linears' weights ({r['zeros_in_model']:.1%} "
              f"of all parameters); stored dense, so the run is as large and as fast as before\nwrote {o.out}")
        return 0
    if o.calibration is None:
        raise InputError("--calibration DATA is needed to rank heads, channels and layers")
    if o.target_params is not None and any(v is not None for v in explicit):
        raise InputError("--target-params excludes --heads-per-layer/--d-ff/--n-layer/--d-model: give one or the other")
    shape = None if o.target_params is not None else PruneShape(n_layer=o.n_layer, heads_per_layer=o.heads_per_layer,
                                                                d_ff=o.d_ff, d_model=o.d_model)
    r = prune_run(o.run, o.out, o.calibration, shape, o.target_params, batch_size=o.calibration_batch_size,
                  num_batches=o.calibration_batches, split=o.calibration_split, overwrite=o.overwrite)
    if o.json:
        print(json.dumps(r, indent=2))
    else:
        print(f"pruned {r['params_before']:,} -> {r['params_after']:,} parameters "
              f"({r['params_after'] / r['params_before']:.2f}x): n_layer {r['n_layer']} (kept {r['layers_kept']}), "
              f"heads {r['n_head']} (kv {r['n_kv_head']}), d_ff {r['d_ff']}, d_model {r['d_model']}, "
              f"head_size {r['head_size']}; ranked on {r['calibration_tokens']:,} tokens\nwrote {o.out}")
    return 0
