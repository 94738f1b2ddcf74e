"""The two kinds of curation step, as protocols: what a recipe holds and what prepare runs.

- `DocumentStep`: decides about one document at a time, in any worker, in any order: returns the
  document (possibly changed) to keep it, or a reason string to drop it; `counts` holds its
  step-specific counters (lines removed, PII found by kind). Every filter, `Clean`, `LanguageID`
  and `PIIRedactor` is one.
- `CorpusStep`: sees a key of every document of the corpus before it decides about any (cross-
  document line frequencies for boilerplate, content hashes and MinHash bands for dedup). It
  runs in three parts: `key_counter` turns one shard's documents into key arrays (in the
  workers), `decide` turns every shard's keys into a verdict written to its own folder of the
  work folder (once, in the main process), and the verdict is applied either as a per-document
  step in the step's place in the chain (`applier`, `drops_by_mask` False: the steps before it
  run once more in a key pass first) or as a drop mask over the curated documents
  (`drops_by_mask` True: its keys are counted in the curation pass itself, so it must be the
  last step).

The recipe (`gptforge.data.pipeline.Recipe`), prepare's curation phase and the report tell the
kinds apart by these protocols, never by a step's name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from gptforge.data.readers.base import Document

if TYPE_CHECKING:
    from gptforge.data.phases.work import WorkFolder


@runtime_checkable
class DocumentStep(Protocol):
    """A per-document step: `step(doc)` -> the kept document, or the reason it is dropped."""

    name: str
    counts: Counter

    def __call__(self, doc: Document) -> Document | str: ...


class KeyCounter(Protocol):
    """Accumulates a corpus step's keys over one shard's documents, batch by batch."""

    def add(self, texts: Sequence[str]) -> None:
        """Count the keys of a batch of document texts (in reading order)."""
        ...

    def arrays(self) -> dict[str, np.ndarray]:
        """The shard's keys, {key name: array}, saved as `NNNNN.<key name>.npy`."""
        ...


@runtime_checkable
class CorpusStep(Protocol):
    """A step that sees every document's keys before it decides (see the module docstring)."""

    name: str
    #: True: the verdict is a drop mask per curated shard (`<name>/NNNNN.npy`); the step is last.
    drops_by_mask: bool
    #: the progress label and timing name of its key pass (a step with `drops_by_mask` has none).
    key_pass: str

    def key_counter(self) -> KeyCounter:
        """A fresh accumulator of this step's keys for one shard."""
        ...

    def decide(self, work: WorkFolder, keys: list[dict[str, Path]], documents: list[int]) -> dict[str, Any]:
        """The verdict from every shard's key files (`keys[i][key name]`, `documents[i]` documents
        in shard i), written into `work.step_dir(self.name)`; returns what the report shows
        (with a "step" entry, `StepStats.to_dict()`, when it drops documents by mask)."""
        ...

    def applier(self, work: WorkFolder) -> DocumentStep | None:
        """The per-document step applying the verdict in the chain (None with `drops_by_mask`)."""
        ...


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


def step_from_dict(d: dict[str, Any]) -> StepStats:
    """The inverse of `StepStats.to_dict`."""
    return StepStats(d["name"], d["documents_in"], d["documents_out"], d["characters_in"], d["characters_out"],
                     Counter(d["dropped"]), {k: list(v) for k, v in d["examples"].items()}, Counter(d["counts"]))
