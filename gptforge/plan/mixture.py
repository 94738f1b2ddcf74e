"""A mixture's token budget and epochs per source, for `gptforge plan --data DIR --data-weights ...`.

Source i of weight w_i (normalized) gets w_i x D of a run's D training tokens, which is
w_i x D / T_i epochs of its T_i train tokens. Beyond about 4 epochs repeated data is worth much
less than new data (Muennighoff et al. 2023, Scaling Data-Constrained Language Models), which
`gptforge.data.mixture.MAX_USEFUL_EPOCHS` flags.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SourceBudget:
    """One source of a planned mixture: name, weight (normalized), train tokens it holds, tokens
    the run draws from it, and the epochs that makes."""

    name: str
    weight: float
    train_tokens: int
    tokens: float
    epochs: float


def mixture_budget(data: str | Path | list, weights: dict[str, float] | None, tokens: float) -> list[SourceBudget]:
    """Per-source budget of `tokens` training tokens over the mixture `data` (several shard
    folders, or one prepared with several --source; see gptforge.data.mixture.mixture_folders).

    weights: name -> weight (normalized here); None: proportional to train tokens, as training
    resolves it.

    Raises:
        ValueError: `data` is a single plain shard folder, or the weights do not name the sources.
        FileNotFoundError: a source without meta.json.
    """
    from gptforge.data.mixture import mixture_folders, normalize_weights, proportional_weights
    from gptforge.data.shards import load_meta

    folders = mixture_folders(data)
    if folders is None:
        raise ValueError(f"--data {data}: one source; a mixture budget needs several folders or a folder "
                         "prepared with several --source")
    sizes = {n: int(load_meta(d, verify_files=False)["splits"]["train"]["tokens"]) for n, d in folders.items()}
    w = normalize_weights(dict(weights), list(sizes)) if weights else proportional_weights(sizes)
    return [SourceBudget(n, w[n], sizes[n], w[n] * tokens, w[n] * tokens / max(sizes[n], 1)) for n in sizes]


def format_budget(rows: list[SourceBudget]) -> str:
    """The mixture table of `plan`, with a warning line per source repeated beyond 4 epochs."""
    from gptforge.data.mixture import MAX_USEFUL_EPOCHS

    lines = ["Mixture (tokens per source = weight x training tokens):",
             f"  {'source':<16} {'weight':>7} {'train tokens':>14} {'tokens drawn':>14} {'epochs':>8}"]
    for r in rows:
        lines.append(f"  {r.name:<16} {r.weight:>7.3f} {r.train_tokens:>14,} {r.tokens:>14,.0f} {r.epochs:>8.2f}")
    for r in rows:
        if r.epochs > MAX_USEFUL_EPOCHS:
            lines.append(f"  WARNING: {r.name} repeats {r.epochs:.1f} epochs, more than {MAX_USEFUL_EPOCHS:g} "
                         "(Muennighoff et al. 2023): lower its weight or add data to it")
    return "\n".join(lines)
