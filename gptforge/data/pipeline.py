"""Curation recipes: named, YAML-configured chains of document steps, each counting its drops.

A recipe is a mapping with an optional `normalization` (the Unicode form every document gets
on reading: NFC (default), NFKC or none), an optional `language` (the language table,
`gptforge.data.languages`, for documents the langid step did not label with a language that has
one; en by default) and a list of steps, each a one-key mapping
`{step_name: {option: value, ...}}`::

    normalization: NFC
    language: zh
    steps:
      - clean: {whitespace: true}
      - boilerplate: {min_documents: 10}
      - langid: {languages: [en, zh], min_score: 0.65}
      - c4: {}
      - gopher_quality: {min_words: 30}
      - pii: {kinds: [email, ip_address]}
      - dedup: {exact: true, near: true, ngram: 5, bands: 14, rows: 8}

Per-document steps (`STEPS`, `gptforge.data.steps.DocumentStep`) run in order on each document,
in any worker. Corpus steps (`CORPUS_STEPS`, `gptforge.data.steps.CorpusStep`) need the whole
corpus: `boilerplate` (line document frequencies; the steps before it run in a key pass first)
and `dedup` (every document's hashes; its verdict is a drop mask, so it must be the last step).
A step of another package is named `module:Class` (`step_class`; docs/extending.md).
Built-in recipes: `none`, `default`, `web` and `code`
(`RECIPES`; `gptforge prepare --show-recipe NAME` prints them). The Gopher, C4 and FineWeb
steps take each document's thresholds from its language's table (`filters.RuleFilter`);
options written in the recipe apply to every language.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gptforge.data.boilerplate import BoilerplateConfig
from gptforge.data.dedup import DedupConfig
from gptforge.data.filters import (
    Blocklist,
    C4Quality,
    FineWebQuality,
    GopherQuality,
    LengthFilter,
)
from gptforge.data.langid import LanguageID
from gptforge.data.languages import load_language, options_in_force, table_language
from gptforge.data.normalize import Clean
from gptforge.data.pii import PIIRedactor
from gptforge.data.quality import QualityStep
from gptforge.data.readers import Document
from gptforge.data.repetition import GopherRepetition
from gptforge.data.steps import CorpusStep, DocumentStep, StepStats

#: the recipe step that scores documents with a trained classifier; a recipe's last step
#: (`gptforge.data.quality.QualityStep`, run by `gptforge.data.phases.quality`).
QUALITY_STEP = "quality"
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
#: steps whose thresholds come from each document's language's table (`filters.RuleFilter`).
LANGUAGE_STEPS = ("c4", "gopher_quality", "gopher_repetition", "fineweb")
#: corpus steps (`gptforge.data.steps.CorpusStep`) by recipe name.
CORPUS_STEPS: dict[str, type] = {"boilerplate": BoilerplateConfig, "dedup": DedupConfig}
_TUPLE_OPTIONS = ("kinds", "stop_words", "languages")
TOP_LEVEL_KEYS = ("normalization", "language", "steps", "description")


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


def with_languages(recipe: dict[str, Any], languages: list[str] | None, score: float | None) -> dict[str, Any]:
    """`recipe` with its langid step keeping `languages` (added after `clean`, or first, when absent)."""
    if not languages and score is None:
        return recipe
    steps = list(recipe.get("steps") or [])
    opts: dict[str, Any] = {}
    if languages:
        opts["languages"] = list(languages)
    if score is not None:
        opts["min_score"] = score
    for i, entry in enumerate(steps):
        if isinstance(entry, dict) and "langid" in entry:
            steps[i] = {"langid": {**(entry["langid"] or {}), **opts}}
            break
    else:
        at = next((i + 1 for i, e in enumerate(steps) if isinstance(e, dict) and "clean" in e), 0)
        steps.insert(at, {"langid": opts})
    return {**recipe, "steps": steps}


def with_quality(recipe: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """`recipe` with its `quality` step's options updated by `options` (the values given, None
    left out), the step appended last when the recipe has none; `recipe` itself when no option
    is given."""
    given = {k: v for k, v in options.items() if v is not None}
    if not given:
        return recipe
    steps = list(recipe.get("steps") or [])
    if steps and isinstance(steps[-1], dict) and QUALITY_STEP in steps[-1]:
        given = {**(steps[-1][QUALITY_STEP] or {}), **given}
        steps = steps[:-1]
    if "keep" in options and options.get("threshold") is not None:
        given.pop("keep", None)  # a threshold given now replaces the recipe's keep fraction
    if options.get("keep") is not None:
        given.pop("threshold", None)
    return {**recipe, "steps": [*steps, {QUALITY_STEP: given}]}


def recipe_languages(recipe: dict[str, Any]) -> list[str]:
    """The language tables a recipe's documents are judged by: the tables of its langid step's
    kept languages (the recipe's `language`, en by default, for a kept language without a table),
    or the recipe's `language` alone when no langid step keeps a list of languages."""
    default = load_language(recipe.get("language") or "en").code
    found: list[str] = []
    for entry in recipe.get("steps") or []:
        if isinstance(entry, dict) and "langid" in entry:
            for code in (entry["langid"] or {}).get("languages") or []:
                lang = table_language(code, default)
                if lang not in found:
                    found.append(lang)
    return found or [default]


def parameters_in_force(recipe: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """step name -> language -> every option of that step's filter as it runs on that language's
    documents (`languages.options_in_force`, defaults included), for the recipe's
    language-aware steps and `recipe_languages`."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    langs = recipe_languages(recipe)
    for entry in recipe.get("steps") or []:
        name, options = next(iter(entry.items())) if isinstance(entry, dict) else (entry, {})
        if name in LANGUAGE_STEPS:
            out[name] = {}
            for lang in langs:
                f = STEPS[name](**options_in_force(name, options or {}, lang))
                out[name][lang] = {k.name: _plain(getattr(f, k.name)) for k in dataclasses.fields(f)
                                   if k.init and k.name not in ("name", "counts", "line_examples", "language")}
    return out


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else dict(v) if isinstance(v, dict) else v


def show_recipe(name_or_path: str, languages: list[str] | None = None, quality: dict[str, Any] | None = None) -> str:
    """The recipe as YAML text (with `languages` as `--languages` sets them, `with_languages`, and
    the --quality-* options as `with_quality` adds them), then, as comments, the parameters in
    force per language for its Gopher, C4 and FineWeb steps."""
    recipe = with_quality(with_languages(load_recipe(name_or_path), languages, None), quality or {})
    text = yaml.safe_dump(recipe, sort_keys=False, allow_unicode=True)
    params = parameters_in_force(recipe)
    if params:
        shown = yaml.safe_dump({"parameters_in_force": params}, sort_keys=False, allow_unicode=True,
                               default_flow_style=None, width=100)
        text += "# The Gopher, C4 and FineWeb steps run with these options on each language's documents\n"
        text += "# (its table in gptforge/data/languages/, then the recipe's own options):\n"
        text += "".join(f"# {line}\n" for line in shown.splitlines())
    return text


@dataclass
class Recipe:
    """A checked recipe: the Unicode normalization form and the chain of steps in run order.

    `chain` holds `DocumentStep`s and `CorpusStep`s (`gptforge.data.steps`); at most one corpus
    step drops by mask, and it is last.
    """

    normalization: str | None
    chain: list[DocumentStep | CorpusStep]
    quality: QualityStep | None = None
    """The recipe's last step when it is `quality` (kept out of `chain`: it runs after it)."""

    @property
    def steps(self) -> list[DocumentStep]:
        """The per-document steps, in run order."""
        return [s for s in self.chain if not isinstance(s, CorpusStep)]

    @property
    def corpus_steps(self) -> list[CorpusStep]:
        """The corpus steps, in run order."""
        return [s for s in self.chain if isinstance(s, CorpusStep)]

    @property
    def mask_step(self) -> CorpusStep | None:
        """The last step when it is a corpus step whose verdict is a drop mask, else None."""
        last = self.chain[-1] if self.chain else None
        return last if isinstance(last, CorpusStep) and last.drops_by_mask else None

    def step_names(self) -> list[str]:
        """Every step's name in run order (corpus steps and the quality step included)."""
        return [s.name for s in self.chain] + ([self.quality.name] if self.quality is not None else [])


#: every step a recipe can name: per-document steps, then corpus steps.
ALL_STEPS: dict[str, type] = {**STEPS, **CORPUS_STEPS, QUALITY_STEP: QualityStep}


def _recipe_step(i: int, entry: Any, language: str = "en") -> Any:
    """The step of recipe entry `i` (0-based), checked (see `build_recipe`); a language-aware
    step (`LANGUAGE_STEPS`) gets `language`'s table under the recipe's options, which it keeps as
    `recipe_options` for documents of other languages."""
    if isinstance(entry, str):
        entry = {entry: {}}
    if not isinstance(entry, dict) or len(entry) != 1:
        raise ValueError(f"recipe step {i + 1}: expected a one-key mapping like {{c4: {{}}}}, got {entry!r}")
    (name, options), = entry.items()
    options = options or {}
    if not isinstance(options, dict):
        raise ValueError(f"recipe step {name!r}: options must be a mapping, got {options!r}")
    cls = step_class(name) if ":" in name else ALL_STEPS.get(name)
    if cls is None:
        raise ValueError(f"recipe step {i + 1}: unknown step {name!r}{_hint(name, ALL_STEPS)}")
    known = {f.name for f in dataclasses.fields(cls) if f.init and f.name not in ("name", "counts")}
    for key in options:
        if key not in known:
            raise ValueError(f"recipe step {name!r}: unknown option {key!r}{_hint(key, known)}")
    if name in LANGUAGE_STEPS:
        step = cls(**options_in_force(name, options, language))
        step.recipe_options = dict(options)
        return step
    step = cls(**{k: tuple(v) if isinstance(v, list) and k in _TUPLE_OPTIONS else v for k, v in options.items()})
    if ":" in name and not isinstance(step, (DocumentStep, CorpusStep)):  # an out-of-tree step
        raise ValueError(f"recipe step {name!r}: {cls.__name__} is neither a DocumentStep nor a CorpusStep "
                         "(gptforge.data.steps): it needs `name`, `counts` and `__call__(doc)`")
    return step


def step_class(spec: str) -> type:
    """The class of an out-of-tree step named `module:Class` in a recipe: imported (the module must
    be importable wherever prepare runs a phase: its workers are spawned with this process's
    sys.path; with --executor ray, on every node). It must be a dataclass (its init fields are the
    recipe options) whose instances are a `DocumentStep` or a `CorpusStep`.

    Raises:
        ValueError: `spec` is not `module:Class`, the module cannot be imported, it has no such
            class, or the class is not a dataclass.
    """
    import importlib

    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name.isidentifier():
        raise ValueError(f"recipe step {spec!r}: an out-of-tree step is named module:Class (e.g. mysteps:Shout)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"recipe step {spec!r}: cannot import {module_name!r} ({e}); is it on PYTHONPATH?") from None
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type) or not dataclasses.is_dataclass(cls):
        raise ValueError(f"recipe step {spec!r}: {module_name} has no dataclass {class_name!r} (a step is a "
                         "dataclass whose fields are its recipe options)")
    return cls


def build_recipe(recipe: dict[str, Any]) -> Recipe:
    """Instantiate and check a recipe.

    Raises:
        ValueError: an unknown key, step or option (the message names it and the nearest valid
            name), a corpus step named twice, a step after one that drops by mask (dedup), a
            `quality` step that is not last, or its options out of range (`QualityStep.check`).
    """
    for key in recipe:
        if key not in TOP_LEVEL_KEYS:
            raise ValueError(f"recipe: unknown key {key!r}{_hint(key, TOP_LEVEL_KEYS)}")
    form = recipe.get("normalization", "NFC")
    if form in (None, "none", False):
        form = None
    elif form not in ("NFC", "NFKC"):
        raise ValueError(f"recipe: normalization must be NFC, NFKC or none, got {form!r}")
    try:
        language = load_language(recipe.get("language") or "en").code
    except ValueError as e:
        raise ValueError(f"recipe: language: {e}") from None
    chain: list[DocumentStep | CorpusStep] = []
    entries = list(recipe.get("steps") or [])
    quality = None
    for i, entry in enumerate(entries):
        name = next(iter(entry)) if isinstance(entry, dict) and entry else entry
        if name == QUALITY_STEP:
            if i != len(entries) - 1:
                raise ValueError(f"recipe step {i + 1} ({QUALITY_STEP!r}) must be the last step: it scores what every "
                                 "other step kept (after dedup)")
            quality = _recipe_step(i, entry, language)
            assert isinstance(quality, QualityStep)
            quality.check()
            break
        if chain and isinstance(chain[-1], CorpusStep) and chain[-1].drops_by_mask:
            last, name = chain[-1].name, next(iter(entry)) if isinstance(entry, dict) and entry else entry
            raise ValueError(f"recipe step {i + 1} ({name!r}) comes after {last}; {last} must be the last step")
        step = _recipe_step(i, entry, language)
        if isinstance(step, CorpusStep) and any(type(s) is type(step) for s in chain):
            raise ValueError(f"recipe step {i + 1}: a second {step.name} step")
        chain.append(step)
    return Recipe(form, chain, quality)


def _hint(name: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def apply_steps(docs: Iterable[Document], steps: list[DocumentStep], stats: list[StepStats] | None = None) -> Iterator[Document]:
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
            st.characters_in += len(doc.text)
            out = step(doc)
            if isinstance(out, str):
                st.dropped[out] += 1
                st.add_example(out, doc.text)
                break
            doc = out
            st.documents_out += 1
            st.characters_out += len(doc.text)
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
                    f"examples in report.html (written when prepare completes), and relax or remove the step in the recipe if this is wrong")
        warned.append(st.name)
    return warned
