"""Curation recipes: named, YAML-configured chains of document steps, each counting its drops.

A recipe is a list of steps, each a one-key mapping `{step_name: {option: value, ...}}`::

    steps:
      - c4: {}
      - gopher_quality: {min_words: 30}
      - pii: {kinds: [email, ip_address]}
      - dedup: {exact: true, near: true, ngram: 5, bands: 14, rows: 8}

Per-document steps (every name in `STEPS`) run in order on each document, in any worker; the
`dedup` step is global (it needs every document's hash) and is returned separately by
`build_steps` for the caller to run after the per-document steps. Built-in recipes: `default`,
`web` and `code` (see `RECIPES`; `gptforge prepare --show-recipe NAME` prints them).

Not yet here (issue 3, still open): language ID, boilerplate-line removal, ftfy repair, the
sharded resumable runner and the HTML report.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gptforge.data.filters import Blocklist, C4Quality, FineWebQuality, GopherQuality, GopherRepetition, LengthFilter
from gptforge.data.pii import PIIRedactor
from gptforge.data.readers import Document

#: per-document steps by recipe name.
STEPS: dict[str, type] = {
    "length": LengthFilter,
    "blocklist": Blocklist,
    "c4": C4Quality,
    "gopher_quality": GopherQuality,
    "gopher_repetition": GopherRepetition,
    "fineweb": FineWebQuality,
    "pii": PIIRedactor,
}


@dataclass
class DedupConfig:
    """The global deduplication step (see `gptforge.data.dedup`; FineWeb's defaults)."""

    exact: bool = True
    near: bool = True
    ngram: int = 5
    bands: int = 14
    rows: int = 8
    seed: int = 1


_DEDUP = {"dedup": {}}
RECIPES: dict[str, dict[str, Any]] = {
    "default": {"steps": [{"pii": {}}, copy.deepcopy(_DEDUP)]},
    "web": {"steps": [{"blocklist": {}}, {"c4": {"filter_curly_bracket": False}}, {"gopher_repetition": {}},
                      {"gopher_quality": {}}, {"fineweb": {}}, {"pii": {}}, copy.deepcopy(_DEDUP)]},
    # Source code: prose filters would drop it all (no terminal punctuation, symbols, short lines).
    "code": {"steps": [{"pii": {"kinds": ["email", "ip_address", "credit_card"]}}, copy.deepcopy(_DEDUP)]},
}


def load_recipe(name_or_path: str) -> dict[str, Any]:
    """A built-in recipe by name, or a YAML recipe file.

    Raises:
        FileNotFoundError: neither a built-in name nor an existing file.
        ValueError: the YAML is not a mapping with a `steps` list.
    """
    if name_or_path in RECIPES:
        return copy.deepcopy(RECIPES[name_or_path])
    path = Path(name_or_path)
    if not path.is_file():
        raise FileNotFoundError(f"recipe {name_or_path!r} is neither a built-in ({', '.join(RECIPES)}) nor a file")
    recipe = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(recipe, dict) or not isinstance(recipe.get("steps"), list):
        raise ValueError(f"{path}: a recipe is a mapping with a 'steps' list")
    return recipe


def show_recipe(name_or_path: str) -> str:
    """The recipe as YAML text."""
    return yaml.safe_dump(load_recipe(name_or_path), sort_keys=False, allow_unicode=True)


def build_steps(recipe: dict[str, Any]) -> tuple[list[Any], DedupConfig | None]:
    """Instantiate a recipe: (per-document steps in order, dedup config or None).

    Raises:
        ValueError: an unknown step or option (the message names it and the nearest valid name).
    """
    steps: list[Any] = []
    dedup: DedupConfig | None = None
    for i, entry in enumerate(recipe.get("steps", [])):
        if isinstance(entry, str):
            entry = {entry: {}}
        if not isinstance(entry, dict) or len(entry) != 1:
            raise ValueError(f"recipe step {i + 1}: expected a one-key mapping like {{c4: {{}}}}, got {entry!r}")
        (name, options), = entry.items()
        options = options or {}
        cls = DedupConfig if name == "dedup" else STEPS.get(name)
        if cls is None:
            raise ValueError(f"recipe step {i + 1}: unknown step {name!r}{_hint(name, list(STEPS) + ['dedup'])}")
        known = {f.name for f in dataclasses.fields(cls) if f.name not in ("name", "counts")}
        for key in options:
            if key not in known:
                raise ValueError(f"recipe step {name!r}: unknown option {key!r}{_hint(key, known)}")
        options = {k: tuple(v) if isinstance(v, list) and k in ("kinds", "stop_words") else v for k, v in options.items()}
        if name == "dedup":
            dedup = DedupConfig(**options)
        else:
            steps.append(cls(**options))
    return steps, dedup


def _hint(name: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


EXAMPLE_CHARS = 200
EXAMPLES_PER_REASON = 3


@dataclass
class StepStats:
    """Documents and characters in/out of one step, drop reasons with counts and examples."""

    name: str
    documents_in: int = 0
    documents_out: int = 0
    characters_in: int = 0
    characters_out: int = 0
    dropped: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    counts: Counter = field(default_factory=Counter)  # step-specific (lines removed, PII by kind)

    def add_example(self, reason: str, text: str) -> None:
        ex = self.examples.setdefault(reason, [])
        if len(ex) < EXAMPLES_PER_REASON:
            ex.append(text[:EXAMPLE_CHARS] + ("…" if len(text) > EXAMPLE_CHARS else ""))

    def merge(self, other: StepStats) -> None:
        self.documents_in += other.documents_in
        self.documents_out += other.documents_out
        self.characters_in += other.characters_in
        self.characters_out += other.characters_out
        self.dropped.update(other.dropped)
        self.counts.update(other.counts)
        for reason, texts in other.examples.items():
            for t in texts:
                ex = self.examples.setdefault(reason, [])
                if len(ex) < EXAMPLES_PER_REASON:
                    ex.append(t)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "documents_in": self.documents_in, "documents_out": self.documents_out,
                "characters_in": self.characters_in, "characters_out": self.characters_out,
                "dropped": dict(self.dropped), "examples": self.examples, "counts": dict(self.counts)}


def apply_steps(docs: Iterable[Document], steps: list[Any], stats: list[StepStats] | None = None) -> Iterator[Document]:
    """Run per-document `steps` over `docs`, filling one `StepStats` per step (created if absent).

    A step returns the document (possibly changed) to keep it, or a reason string to drop it.
    """
    if stats is None:
        stats = []
    while len(stats) < len(steps):
        stats.append(StepStats(steps[len(stats)].name))
    for doc in docs:
        for step, st in zip(steps, stats):
            st.documents_in += 1
            st.characters_in += len(doc["text"])
            out = step(doc)
            if isinstance(out, str):
                st.dropped[out] += 1
                st.add_example(out, doc["text"])
                break
            doc = out
            st.documents_out += 1
            st.characters_out += len(doc["text"])
        else:
            yield doc
    for step, st in zip(steps, stats):
        st.counts.update(step.counts)
        step.counts.clear()
