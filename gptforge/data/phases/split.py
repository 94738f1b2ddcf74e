"""Phase 2, split: each curated document's split (train, val or test), decided once for all phases.

A document's split is a hash of its split key (`split_key`: a hash of its curated text, never of
where it lies) and the seed (`split_score`, `assign_split`): independent of reading order, worker
count, the corpus's folder and how its path was typed. Two rules guarantee the splits asked for on a
small corpus: the train documents with the lowest scores move to an empty val (test) split
(`_small_corpus_rule`), and when that leaves val (or test) empty (one input.txt is one
document) they are cut from the end of the largest train document instead, by character
position at a line break (`_position_split`).

Inputs: the work folder's curated shards and drop masks, the `SplitRule`. Output: `Splits`
(documents moved by the rules, the position cuts, the documents per split).
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from gptforge.data.normalize import NormalizeStats
from gptforge.data.phases.work import WorkFolder
from gptforge.data.readers import ReadStats
from gptforge.data.shards import SPLITS
from gptforge.data.steps import StepStats
from gptforge.errors import InputError

log = logging.getLogger("gptforge.data")


class EmptyCorpusError(InputError):
    """No document survived reading, normalization and the recipe (the message names the step)."""


def split_score(doc_id: str, seed: int) -> float:
    """A uniform number in [0, 1) from BLAKE2b(seed, id): the document's split coordinate."""
    h = hashlib.blake2b(f"{seed}\x00{doc_id}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2.0**64


def assign_split(doc_id: str, seed: int, val_fraction: float, test_fraction: float) -> str:
    """"val" when score < val_fraction, "test" when below val + test fraction, else "train".

    Depends only on (id, seed, fractions): not on reading order or worker count.
    """
    u = split_score(doc_id, seed)
    if u < val_fraction:
        return "val"
    if u < val_fraction + test_fraction:
        return "test"
    return "train"


def split_key(text: str) -> str:
    """A document's split key: the hex BLAKE2b-128 of its curated text (UTF-8).

    A hash of the content, not of where the document lies: the same corpus copied to another
    folder, named by an absolute instead of a relative path, by its files or globs instead of
    its folder, or in another input order, gets the same keys and so the same splits. Chosen
    over the input argument's index plus the path inside that input (the other key that does not
    depend on the location) because that one still changes with the order and grouping of the
    input arguments (one file per argument, reversed, is another split), and because a content
    key puts identical documents, which a recipe without dedup keeps, in one split, so that no
    copy of a val document trains. It is the text after the recipe's steps: a step that rewrites a
    document (PII redaction, boilerplate lines) can move it to another split under another
    recipe. The rules that move or cut a document by key (`_small_corpus_rule`,
    `_position_split`) move or cut every copy and count them.
    """
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


@dataclass(frozen=True)
class SplitRule:
    """The options that decide a document's split: the hash seed and the val/test fractions."""

    seed: int
    val_fraction: float
    test_fraction: float

    def score(self, key: str) -> float:
        return split_score(key, self.seed)

    def assign(self, key: str) -> str:
        return assign_split(key, self.seed, self.val_fraction, self.test_fraction)


@dataclass
class _Scan:
    documents: dict[str, int] = field(default_factory=lambda: {s: 0 for s in SPLITS})
    lowest_train: list[tuple[float, str]] = field(default_factory=list)  # 2 lowest (score, key)
    copies: Counter = field(default_factory=Counter)  # documents of each key in lowest_train


@dataclass
class Splits:
    """The split phase's output: what every later phase needs to put a document in its split."""

    rule: SplitRule
    moved: dict[str, str]  # split key -> split, for documents the small-corpus rules moved
    cuts: dict[str, list]  # split key -> [[0, "train"], [start, "val"], ...]: a document cut by position
    documents: dict[str, int]  # documents (pieces) per split
    curated: int  # documents curated (before position cuts)
    pieces_added: int = 0  # texts the position cuts add on top of the documents cut

    def split_of(self, key: str) -> str:
        """The split of an uncut document."""
        return self.moved.get(key) or self.rule.assign(key)


#: a split cut from inside a document holds at least this many characters (~4k tokens: a few
#: context windows of a small model), or a quarter of the document when that is less.
MIN_POSITION_SPLIT_CHARS = 16_384


def cut_pieces(text: str, cut: list[list]) -> list[tuple[str, str]]:
    """(split, piece) of `text` for a cut [[0, "train"], [c1, "val"], ...] (start characters)."""
    bounds = [int(b) for b, _ in cut] + [len(text)]
    return [(split, text[bounds[k]:bounds[k + 1]]) for k, (_, split) in enumerate(cut)]


def _snap(text: str, pos: int) -> int:
    """`pos` moved forward to just after the next line break (or space) within 1/20 of the text."""
    limit = min(len(text), pos + max(64, len(text) // 20))
    for sep in ("\n", " "):
        k = text.find(sep, pos, limit)
        if k >= 0:
            return k + 1
    return pos


FEW_DOCUMENTS_ADVICE = "give more documents, or cut a file into documents with --doc-separator, for a split by document"
"""What a `gptforge prepare` user can do when the corpus has too few documents for a split by document
(`_position_split`'s warning); a workflow that prepares the data itself passes its own (`few_documents_advice`)."""


def _position_split(rule: SplitRule, scan: _Scan, work: WorkFolder, masks: list, moved: dict[str, str],
                    doc_separator: str | None = None, rstats: ReadStats | None = None,
                    few_documents_advice: str = FEW_DOCUMENTS_ADVICE) -> tuple[dict[str, list], int]:
    """Val/test cut from the end of the largest train document, when the document split leaves them empty.

    nanoGPT's layout (one input.txt) is one document, so a split by document gives val nothing:
    then the last `val_fraction` (and before it `test_fraction`) of that document's characters,
    at least `MIN_POSITION_SPLIT_CHARS` each (at most a quarter of the document), become the
    val (test) split, cut just after a line break. With enough documents nothing is cut.
    Every copy of that document (the same split key) is cut alike. Updates `scan.documents`.
    Returns ({split key: [[0, "train"], [start, split], ...]}, pieces the cuts add). `rstats`
    (what reading found) lets the warning say when --doc-separator occurred in no file;
    `few_documents_advice` is the fix the warning names otherwise.
    """
    missing = [s for s, f in (("test", rule.test_fraction), ("val", rule.val_fraction)) if f > 0 and not scan.documents[s]]
    if not missing:
        return {}, 0
    best: tuple[int, str, str] | None = None  # (characters, split key, id)
    for i, mask in enumerate(masks):
        for _, d in work.documents(i, mask):
            split = moved.get(d["key"]) or rule.assign(d["key"])
            if split == "train" and (best is None or len(d["text"]) > best[0]):
                best = (len(d["text"]), d["key"], d["id"])
    if best is None:
        return {}, 0
    copies = 0
    for i, mask in enumerate(masks):
        for _, d in work.documents(i, mask):
            if d["key"] == best[1]:
                text = d["text"]
                copies += 1
    n = len(text)
    fractions = {"val": rule.val_fraction, "test": rule.test_fraction}
    cut: list[list] = []
    end = n
    for split in missing:  # test last in the text, val before it (nanoGPT: val is the end)
        size = min(max(int(fractions[split] * n), MIN_POSITION_SPLIT_CHARS), n // 4)
        start = _snap(text, end - size) if size else end
        if not 0 < start < end:
            continue
        cut.insert(0, [start, split])
        end = start
    if not cut:
        return {}, 0
    for _, split in cut:
        scan.documents[split] += copies
    ends = [c[0] for c in cut[1:]] + [n]
    shares = ", ".join(f"{split}: the {b - start:,} characters from {start:,}" for (start, split), b in zip(cut, ends, strict=True))
    not_found = (doc_separator is not None and rstats is not None
                 and rstats.documents <= rstats.files_read)  # no file gave more than one document
    # A separated file's ids are PATH@N (gptforge.data.readers.text): name the file itself.
    where = f"the one document of {best[2].rsplit('@', 1)[0]}" if not_found else best[2]
    advice = (f"--doc-separator {doc_separator!r} was not found in the input (each file was read as one "
              "document): check the separator, or give more documents, for a split by document" if not_found
              else few_documents_advice)
    log.warning(f"the corpus has too few documents for a {'/'.join(missing)} split by document "
                f"({sum(scan.documents.values()) - len(cut)} after curation): split by position inside "
                f"{where} instead, as nanoGPT does ({shares}, of {n:,}); {advice}")
    return {best[1]: [[0, "train"]] + cut}, copies * len(cut)


def _small_corpus_rule(rule: SplitRule, scan: _Scan) -> dict[str, str]:
    """Guarantee one val document (>= 2 docs) and one test document (>= 3 docs) when asked for.

    With few documents, val_fraction * N < 1 can leave val empty; the train documents with the
    lowest split scores move over (every copy of one, never the last train documents). Scores
    depend only on (split key, seed), so the rule is as order-independent as the split itself.
    """
    moved: dict[str, str] = {}
    total = sum(scan.documents.values())
    train = scan.documents["train"]
    candidates = [k for _, k in scan.lowest_train]
    for split, fraction, least in (("val", rule.val_fraction, 2), ("test", rule.test_fraction, 3)):
        if fraction > 0 and scan.documents[split] == 0 and total >= least and candidates:
            key = candidates.pop(0)
            if scan.copies[key] < train:
                moved[key] = split
                train -= scan.copies[key]
    return moved


def empty_message(files: list[Path], rstats: ReadStats, nstats: NormalizeStats, steps: list[StepStats]) -> str:
    parts = [f"no documents to prepare: {len(files)} file(s) found, {rstats.files_read} read"]
    if not files:
        from gptforge.data.readers import SUPPORTED_EXTS

        parts.append(f"folders are searched for {', '.join(sorted(SUPPORTED_EXTS))} files (optionally compressed); "
                     "name other files explicitly, or use a glob such as 'src/**/*.py'")
    if rstats.documents and nstats.documents_out:
        for st in steps:
            if st.documents_in and not st.documents_out:
                reasons = ", ".join(f"{v} {k}" for k, v in st.dropped.most_common())
                parts.insert(0, f"the recipe step {st.name!r} removed every remaining document "
                                f"({st.documents_in} in: {reasons}); relax its options in the recipe or choose "
                                f"another --recipe")
                break
    if rstats.files_skipped:
        parts.append("files skipped: " + ", ".join(f"{v} {k}" for k, v in sorted(rstats.files_skipped.items())))
    if rstats.records_skipped:
        parts.append("records skipped: " + ", ".join(f"{v} {k}" for k, v in sorted(rstats.records_skipped.items())))
    if nstats.dropped:
        parts.append("documents dropped: " + ", ".join(f"{v} {k}" for k, v in sorted(nstats.dropped.items())))
    if rstats.warnings:
        parts.append(f"first warning: {rstats.warnings[0]}")
    return "; ".join(parts)


def _scan(rule: SplitRule, work: WorkFolder, masks: list) -> _Scan:
    scan = _Scan()
    for i, mask in enumerate(masks):
        for _, d in work.documents(i, mask, ("key",)):
            split = rule.assign(d["key"])
            scan.documents[split] += 1
            if split == "train":
                entry = (rule.score(d["key"]), d["key"])
                if entry in scan.lowest_train:
                    scan.copies[d["key"]] += 1  # a copy: every copy has the key's score
                elif len(scan.lowest_train) < 2 or entry < scan.lowest_train[-1]:
                    scan.lowest_train = sorted(scan.lowest_train + [entry])[:2]
                    scan.copies = Counter({k: scan.copies[k] or 1 for _, k in scan.lowest_train})
    return scan


def run_split(rule: SplitRule, work: WorkFolder, masks: list, files: list[Path], read: ReadStats,
              normalize: NormalizeStats, steps: list[StepStats], doc_separator: str | None,
              few_documents_advice: str = FEW_DOCUMENTS_ADVICE) -> Splits:
    """Phase 2 (see the module docstring); `read`, `normalize`, `steps`: the curation counts, for
    the message when nothing is left; `few_documents_advice`: the fix named when a split by
    position replaces the split by document (`_position_split`).

    Raises:
        EmptyCorpusError: no document left, or none for the train split.
    """
    scan = _scan(rule, work, masks)
    total_docs = sum(scan.documents.values())
    if total_docs == 0:
        raise EmptyCorpusError(empty_message(files, read, normalize, steps))
    moved: dict[str, str] = {}
    if scan.documents["train"] == 0:
        # Every document hashed into val/test (one input.txt does so with probability
        # val_fraction + test_fraction): start them all in train, then split as below.
        copies = Counter(d["key"] for i, mask in enumerate(masks) for _, d in work.documents(i, mask, ("key",)))
        ids = sorted((rule.score(k), k) for k in copies)
        moved = {doc_id: "train" for _, doc_id in ids}
        scan.documents = {"train": total_docs, "val": 0, "test": 0}
        scan.lowest_train = ids[:2]
        scan.copies = Counter({k: copies[k] for _, k in ids[:2]})
    small = _small_corpus_rule(rule, scan)
    moved.update(small)
    for doc_key, split in small.items():
        scan.documents["train"] -= scan.copies[doc_key]
        scan.documents[split] += scan.copies[doc_key]
    if scan.documents["train"] == 0:
        raise EmptyCorpusError(f"no document left for the train split ({total_docs} documents, all in "
                               f"val/test); lower --val-fraction/--test-fraction or add documents")
    cuts, pieces = _position_split(rule, scan, work, masks, moved, doc_separator, read, few_documents_advice)
    return Splits(rule, moved, cuts, scan.documents, total_docs, pieces)
