"""Warnings for what a corpus lost: a recipe that removed most of a source, a split too small.

prepare's per-step warning (`pipeline.warn_heavy_steps`) looks at one step's characters; a recipe
can remove most of a corpus with no single step crossing that line (C4's five-sentence rule
dropping short reviews: documents, not characters). These checks look at the whole recipe, and at
the splits written, and name the source in a mixture.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from gptforge.data.steps import StepStats

log = logging.getLogger("gptforge.data")

#: a recipe that removes more than this share of a source's documents or characters is warned about.
WARN_RECIPE_SHARE = 0.5
#: a split holding fewer documents than this is warned about (its loss is one text's loss).
MIN_SPLIT_DOCUMENTS = 10


def _largest(steps: list[StepStats], what: str) -> tuple[str, str, int]:
    """(step, reason, removed) of the step that removed the most documents (`what` "documents")
    or characters, with its most frequent rule."""
    def removed(st: StepStats) -> int:
        return (st.documents_in - st.documents_out) if what == "documents" else (st.characters_in - st.characters_out)

    top = max(steps, key=removed)
    rules = Counter(top.dropped) + (Counter({f"{k} (lines)": v for k, v in top.counts.items()})
                                    if what == "characters" else Counter())
    reason = rules.most_common(1)[0][0] if rules else "no rule counted"
    return top.name, reason, removed(top)


def warn_recipe_removal(steps: list[StepStats], recipe: str, source: str | None = None,
                        share: float = WARN_RECIPE_SHARE) -> list[str]:
    """Log (and return) a warning when the recipe's steps together removed more than `share` of
    the documents or of the characters they received, naming the step and rule that removed the
    most and the option that gives the source a lighter recipe.

    Args:
        steps: the recipe's step counts, in order (`StepStats`). recipe: the recipe in force (its
            name or file). source: the mixture source's name (None: a single input).
    """
    if not steps or not steps[0].documents_in:
        return []
    first, last = steps[0], steps[-1]
    lighter = "none" if recipe == "default" else "default"
    option = f"--source-recipe {source}={lighter}" if source else f"--recipe {lighter}"
    out = []
    for what, before, after in (("documents", first.documents_in, last.documents_out),
                                ("characters", first.characters_in, last.characters_out)):
        if not before or 1.0 - after / before <= share:
            continue
        step, reason, n = _largest(steps, what)
        msg = (f"{'source ' + source + ': ' if source else ''}recipe {recipe!r} removed {1.0 - after / before:.0%} of "
               f"the {what} ({before - after:,} of {before:,}); most by step {step!r} ({step}: {reason}, {n:,} "
               f"{what}); check the examples in report.html (written when prepare completes), and if the texts are wanted (e.g. short reviews or "
               f"posts under a sentence-count rule) use a lighter recipe: {option}")
        log.warning(msg)
        out.append(msg)
    return out


def small_split_lines(meta: dict[str, Any]) -> list[str]:
    """One line per val/test split of a shard folder's meta.json that holds documents but fewer
    than MIN_SPLIT_DOCUMENTS (a split asked for, by its fraction, and given a few texts). None when
    the splits were cut by position (too few documents to split by document): that cut sizes
    them by text, and says so itself."""
    cfg = meta.get("prepare_config") or {}
    out: list[str] = []
    if cfg.get("position_split"):
        return out
    for split in ("val", "test"):
        n = (meta.get("splits", {}).get(split) or {}).get("documents", 0)
        if cfg.get(f"{split}_fraction", 0) > 0 and 0 < n < MIN_SPLIT_DOCUMENTS:
            tokens = meta["splits"][split].get("tokens", 0)
            out.append(f"the {split} split holds {n} document{'s' if n > 1 else ''} ({tokens:,} tokens), fewer than "
                       f"{MIN_SPLIT_DOCUMENTS}: its loss is the loss of a few texts (and picks the best checkpoint); "
                       f"raise --{split}-fraction, or give more documents (--doc-separator cuts a file into documents)")
    return out


def warn_small_splits(meta: dict[str, Any], source: str | None = None) -> list[str]:
    """Log (and return) `small_split_lines(meta)`, prefixed with the mixture source's name."""
    out = [f"source {source}: {line}" if source else line for line in small_split_lines(meta)]
    for line in out:
        log.warning(line)
    return out
