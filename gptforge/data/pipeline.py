"""Curation recipes: named, YAML-configured chains of document steps, each counting its drops.

A recipe is a mapping with an optional `normalization` (the Unicode form every document gets
on reading: NFC (default), NFKC or none) and a list of steps, each a one-key mapping
`{step_name: {option: value, ...}}`::

    normalization: NFC
    steps:
      - clean: {whitespace: true}
      - boilerplate: {min_documents: 10}
      - langid: {languages: [en, zh], min_score: 0.65}
      - c4: {}
      - gopher_quality: {min_words: 30}
      - pii: {kinds: [email, ip_address]}
      - dedup: {exact: true, near: true, ngram: 5, bands: 14, rows: 8}

Per-document steps (every name in `STEPS`) run in order on each document, in any worker. Two
steps are global, because they need the whole corpus: `boilerplate` (line document
frequencies; the steps before it run in a counting pass first) and `dedup` (every document's
hashes; it must be the last step). Built-in recipes: `none`, `default`, `web` and `code`
(`RECIPES`; `gptforge prepare --show-recipe NAME` prints them).
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

from gptforge.data.filters import (
    Blocklist,
    C4Quality,
    FineWebQuality,
    GopherQuality,
    GopherRepetition,
    LengthFilter,
)
from gptforge.data.langid import LanguageID
from gptforge.data.normalize import Clean
from gptforge.data.pii import PIIRedactor
from gptforge.data.readers import Document

#: per-document steps by recipe name.
STEPS: dict[str, type] = {
    "clean": Clean,
    "langid": LanguageID,
    "length": LengthFilter,
    "blocklist": Blocklist,
    "c4": C4Quality,
    "gopher_quality": GopherQuality,
    "gopher_repetition": GopherRepetition,
    "fineweb": FineWebQuality,
    "pii": PIIRedactor,
}
_TUPLE_OPTIONS = ("kinds", "stop_words", "languages")
TOP_LEVEL_KEYS = ("normalization", "steps", "description")


@dataclass
class DedupConfig:
    """The global deduplication step (see `gptforge.data.dedup`; FineWeb's defaults).

    `simplify`: shingle FineWeb's simplified text (lower case, numbers to 0, no punctuation or
    symbols, whitespace normalized, no diacritics; `dedup.dedup_words`) instead of the
    lower-cased words. `skip_short`: documents with fewer than `ngram` words get no MinHash
    signature and are never near-duplicates (FineWeb/datatrove), instead of one shingle of all
    their words. Exact dedup is unaffected by both.
    """

    exact: bool = True
    near: bool = True
    ngram: int = 5
    bands: int = 14
    rows: int = 8
    seed: int = 1
    simplify: bool = True
    skip_short: bool = True


@dataclass
class BoilerplateConfig:
    """The global boilerplate-line step (see `gptforge.data.boilerplate`).

    A line (at least `min_line_chars` long) held by at least max(`min_documents`,
    `min_fraction` * documents) documents is removed everywhere.
    """

    min_documents: int = 10
    min_fraction: float = 0.001
    min_line_chars: int = 10

    def threshold(self, documents: int) -> int:
        """Documents a line must appear in to count as boilerplate."""
        return max(int(self.min_documents), int(-(-self.min_fraction * documents // 1)))


_DEDUP: dict[str, dict] = {"dedup": {}}
RECIPES: dict[str, dict[str, Any]] = {
    "none": {"description": "reading and Unicode normalization only", "steps": []},
    "default": {"description": "normalization, mojibake/control-character repair, PII redaction, exact and "
                               "near-duplicate removal",
                "steps": [{"clean": {}}, {"pii": {}}, copy.deepcopy(_DEDUP)]},
    "web": {"description": "default + boilerplate lines, English language ID, Gopher/C4/FineWeb quality filters",
            "steps": [{"clean": {"whitespace": True}}, {"boilerplate": {}},
                      {"langid": {"languages": ["en"], "min_score": 0.65}}, {"blocklist": {}},
                      {"c4": {"filter_curly_bracket": False}}, {"gopher_repetition": {}},
                      {"gopher_quality": {}}, {"fineweb": {}}, {"pii": {}}, copy.deepcopy(_DEDUP)]},
    # Source code: prose filters would drop it all (no terminal punctuation, symbols, short
    # lines), and licence headers are kept (they belong to the files).
    "code": {"description": "source code: control-character repair, PII redaction (no phone numbers), dedup",
             "steps": [{"clean": {"fix_mojibake": False}}, {"pii": {"kinds": ["email", "ip_address", "credit_card"]}},
                       copy.deepcopy(_DEDUP)]},
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
        raise FileNotFoundError(f"recipe {name_or_path!r} is neither a built-in ({', '.join(RECIPES)}) nor a file"
                                f"{_hint(name_or_path, RECIPES)}")
    try:
        recipe = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML ({e})") from e
    if not isinstance(recipe, dict) or not isinstance(recipe.get("steps"), list):
        raise ValueError(f"{path}: a recipe is a mapping with a 'steps' list")
    return recipe


def show_recipe(name_or_path: str) -> str:
    """The recipe as YAML text."""
    return yaml.safe_dump(load_recipe(name_or_path), sort_keys=False, allow_unicode=True)


@dataclass
class Recipe:
    """A checked recipe: where each part runs.

    `before` are the per-document steps ahead of the boilerplate step (all of them when there
    is none), `after` the ones behind it; `steps` is before + after.
    """

    normalization: str | None
    before: list[Any]
    boilerplate: BoilerplateConfig | None
    after: list[Any]
    dedup: DedupConfig | None

    @property
    def steps(self) -> list[Any]:
        return self.before + self.after

    def step_names(self) -> list[str]:
        """Every step's name in run order (global steps included)."""
        names = [s.name for s in self.before]
        if self.boilerplate is not None:
            names.append("boilerplate")
        names += [s.name for s in self.after]
        if self.dedup is not None:
            names.append("dedup")
        return names


def build_recipe(recipe: dict[str, Any]) -> Recipe:
    """Instantiate and check a recipe.

    Raises:
        ValueError: an unknown key, step or option (the message names it and the nearest valid
            name), a second boilerplate/dedup step, or dedup not last.
    """
    for key in recipe:
        if key not in TOP_LEVEL_KEYS:
            raise ValueError(f"recipe: unknown key {key!r}{_hint(key, TOP_LEVEL_KEYS)}")
    form = recipe.get("normalization", "NFC")
    if form in (None, "none", False):
        form = None
    elif form not in ("NFC", "NFKC"):
        raise ValueError(f"recipe: normalization must be NFC, NFKC or none, got {form!r}")
    before: list[Any] = []
    after: list[Any] = []
    boilerplate: BoilerplateConfig | None = None
    dedup: DedupConfig | None = None
    entries = recipe.get("steps") or []
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            entry = {entry: {}}
        if not isinstance(entry, dict) or len(entry) != 1:
            raise ValueError(f"recipe step {i + 1}: expected a one-key mapping like {{c4: {{}}}}, got {entry!r}")
        (name, options), = entry.items()
        options = options or {}
        if not isinstance(options, dict):
            raise ValueError(f"recipe step {name!r}: options must be a mapping, got {options!r}")
        if dedup is not None:
            raise ValueError(f"recipe step {i + 1} ({name!r}) comes after dedup; dedup must be the last step")
        cls = {"dedup": DedupConfig, "boilerplate": BoilerplateConfig}.get(name) or STEPS.get(name)
        if cls is None:
            raise ValueError(f"recipe step {i + 1}: unknown step {name!r}"
                             f"{_hint(name, list(STEPS) + ['boilerplate', 'dedup'])}")
        known = {f.name for f in dataclasses.fields(cls) if f.name not in ("name", "counts")}
        for key in options:
            if key not in known:
                raise ValueError(f"recipe step {name!r}: unknown option {key!r}{_hint(key, known)}")
        options = {k: tuple(v) if isinstance(v, list) and k in _TUPLE_OPTIONS else v for k, v in options.items()}
        if name == "dedup":
            dedup = DedupConfig(**options)
        elif name == "boilerplate":
            if boilerplate is not None:
                raise ValueError(f"recipe step {i + 1}: a second boilerplate step")
            boilerplate = BoilerplateConfig(**options)
        else:
            (after if boilerplate is not None else before).append(cls(**options))
    return Recipe(form, before, boilerplate, after, dedup)


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
        for step, st in zip(steps, stats, strict=False):
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
    for step, st in zip(steps, stats, strict=False):
        st.counts.update(step.counts)
        step.counts.clear()
        line_examples = getattr(step, "line_examples", None)
        if line_examples:
            for reason, texts in line_examples.items():
                for t in texts:
                    st.add_example(f"line removed: {reason}", t)
            line_examples.clear()


#: a step that removes more than this share of the characters it receives gets a warning
#: naming it and its rules (examples of what it removed are in report.html).
WARN_REMOVED_SHARE = 0.5


def warn_heavy_steps(stats: list[StepStats], share: float = WARN_REMOVED_SHARE) -> list[str]:
    """Log a warning for every step that removed more than `share` of its input characters.

    The message names the step, the share, and its most frequent rules (documents dropped and
    lines removed). Returns the names of the steps warned about.
    """
    import logging

    log = logging.getLogger("gptforge.data")
    warned = []
    for st in stats:
        if not st.characters_in:
            continue
        removed = 1.0 - st.characters_out / st.characters_in
        if removed <= share:
            continue
        rules = Counter(st.dropped) + Counter({f"{k} (lines)": v for k, v in st.counts.items()})
        top = ", ".join(f"{k}: {v:,}" for k, v in rules.most_common(3)) or "no rule counted"
        log.warning(f"recipe step {st.name!r} removed {removed:.0%} of the characters it received "
                    f"({st.characters_in - st.characters_out:,} of {st.characters_in:,}; {top}); check the "
                    f"examples in report.html, and relax or remove the step in the recipe if this is wrong")
        warned.append(st.name)
    return warned
