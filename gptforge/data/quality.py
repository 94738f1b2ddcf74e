"""A trained quality classifier: keep the documents most like a reference set (the `quality` step).

DCLM (Li et al. 2024, "DataComp-LM", section 4.4) keeps the documents that a classifier trained
on reference text (positives) against random web text (negatives) scores highest, after dedup;
FineWeb-Edu does the same with an educational-value classifier. This module is that classifier at
CPU cost, built from scikit-learn:

- features: hashed character n-grams inside word boundaries (`HashingVectorizer`, analyzer
  `char_wb`, n = 2..4, 2**18 buckets, l2-normalised), of the first `MAX_CHARS` characters of a
  document. Character n-grams need no word segmentation, so Chinese and Japanese text is
  featurised by its characters, as the rule steps count it;
- model: l2-regularised logistic regression (`LogisticRegression`, solver liblinear: one thread,
  deterministic with a seed), trained on 80% of the documents and measured on the other 20%
  (which documents are held out depends on each document's SHA-256 only);
- score: P(reference | document) in [0, 1] (the logistic of the decision function), computed row
  by row, so a document's score does not depend on which other documents share its batch, shard
  or worker: local and Ray runs, and a rerun after a kill, give the same bytes.

A model is kept as one `.npz` file (`QualityModel.save`): the coefficients, the intercept and a
JSON record (feature settings, seed, held-out accuracy, the SHA-256 of every training document).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gptforge.errors import InputError

MODEL_KIND = "gptforge-quality-classifier"
MODEL_VERSION = 1
#: characters of a document the classifier reads (the rest of a long document is not scored).
MAX_CHARS = 20_000
N_FEATURES = 2 ** 18
NGRAM_RANGE = (2, 4)
#: fewer reference documents than this cannot train a classifier worth its cut.
MIN_REFERENCE_DOCUMENTS = 20
#: share of the training documents held out to measure the classifier's accuracy.
HELD_OUT_EVERY = 5


def _sklearn():
    try:
        import sklearn  # noqa: F401
    except ImportError:
        raise InputError("the quality step needs scikit-learn: pip install 'gptforge[curate]' "
                         "(or pip install scikit-learn)") from None


def text_sha256(text: str) -> str:
    """Hex SHA-256 of a document's UTF-8 text (how training documents are recorded)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def featurize(texts: list[str]):
    """Hashed character n-gram features of `texts`: a scipy CSR matrix (len(texts), N_FEATURES),
    float64, each row l2-normalised (see the module docstring)."""
    _sklearn()
    from sklearn.feature_extraction.text import HashingVectorizer

    vec = HashingVectorizer(analyzer="char_wb", ngram_range=NGRAM_RANGE, n_features=N_FEATURES,
                            alternate_sign=False, norm="l2", lowercase=True, dtype=np.float64)
    return vec.transform([t[:MAX_CHARS] for t in texts])


@dataclass
class QualityModel:
    """A trained classifier: `coef` (N_FEATURES,) float64, `intercept` (nats), `meta` (the record)."""

    coef: np.ndarray
    intercept: float
    meta: dict[str, Any] = field(default_factory=dict)

    def scores(self, texts: list[str]) -> np.ndarray:
        """P(reference | text) per text, shape (len(texts),) float64 in [0, 1]."""
        if not texts:
            return np.zeros(0, np.float64)
        x = featurize(texts)
        z = np.asarray(x @ self.coef, dtype=np.float64) + self.intercept
        return 1.0 / (1.0 + np.exp(-z))

    def sha256(self) -> str:
        """Hex SHA-256 of the coefficients and intercept (what decides every score)."""
        h = hashlib.sha256(np.ascontiguousarray(self.coef, dtype=np.float64).tobytes())
        h.update(repr(float(self.intercept)).encode())
        return h.hexdigest()

    def save(self, path: str | Path) -> None:
        """Write the model as one `.npz` file, atomically (temp file, fsync, rename)."""
        from gptforge.atomic import atomic_write_bytes

        buf = io.BytesIO()
        meta = json.dumps({**self.meta, "kind": MODEL_KIND, "version": MODEL_VERSION}, sort_keys=True).encode()
        np.savez(buf, coef=np.ascontiguousarray(self.coef, dtype=np.float64),
                 intercept=np.array([self.intercept], np.float64), meta_json=np.frombuffer(meta, np.uint8))
        atomic_write_bytes(path, buf.getvalue())

    @classmethod
    def load(cls, path: str | Path) -> QualityModel:
        """Read a model written by `save`.

        Raises:
            InputError: the file is missing, or is not a gptforge quality model of this version
                (the message names the file and says how to make one).
        """
        path = Path(path)
        how = "train one with `gptforge prepare ... --quality-reference GOOD/` (it is kept as OUT/quality/model.npz)"
        if not path.is_file():
            raise InputError(f"--quality-model {path}: no such file; {how}")
        try:
            with np.load(path, allow_pickle=False) as z:
                coef, intercept = z["coef"], float(z["intercept"][0])
                meta = json.loads(bytes(z["meta_json"]).decode("utf-8"))
        except (OSError, ValueError, KeyError, EOFError, UnicodeDecodeError, IndexError):
            raise InputError(f"--quality-model {path}: not a gptforge quality model (a .npz file with coef, "
                             f"intercept and meta_json); {how}") from None
        if not isinstance(meta, dict) or meta.get("kind") != MODEL_KIND or meta.get("version") != MODEL_VERSION:
            raise InputError(f"--quality-model {path}: a .npz file of another kind ({meta.get('kind') if isinstance(meta, dict) else meta!r}), "
                             f"not a {MODEL_KIND} version {MODEL_VERSION}; {how}")
        if coef.shape != (N_FEATURES,) or coef.dtype != np.float64:
            raise InputError(f"--quality-model {path}: coefficients of shape {coef.shape} {coef.dtype}, expected "
                             f"({N_FEATURES},) float64; {how}")
        return cls(coef, intercept, meta)


def train_quality_model(positives: list[str], negatives: list[str], seed: int,
                        description: dict[str, Any] | None = None) -> QualityModel:
    """Train the classifier on reference documents (`positives`) against others (`negatives`).

    Documents are ordered by their SHA-256 before training, so the model depends on the two sets
    only, never on reading order. Every `HELD_OUT_EVERY`-th document by hash is held out, and its
    accuracy (at P = 0.5) and ROC AUC (how well the scores rank, which is what a keep fraction
    uses) recorded in `meta["held_out_accuracy"]` and `meta["held_out_auc"]`.

    Raises:
        InputError: fewer than MIN_REFERENCE_DOCUMENTS positives or negatives.
    """
    _sklearn()
    from sklearn.linear_model import LogisticRegression

    for what, docs in (("reference (positive)", positives), ("negative", negatives)):
        if len(docs) < MIN_REFERENCE_DOCUMENTS:
            raise InputError(f"quality step: {len(docs)} {what} documents, at least {MIN_REFERENCE_DOCUMENTS} are "
                             f"needed to train the classifier (a few hundred or more of each make a useful one)")
    rows = sorted([(text_sha256(t), 1, t) for t in positives] + [(text_sha256(t), 0, t) for t in negatives])
    held = [int(h[:8], 16) % HELD_OUT_EVERY == 0 for h, _, _ in rows]
    train = [r for r, h in zip(rows, held, strict=True) if not h]
    test = [r for r, h in zip(rows, held, strict=True) if h]
    if len({y for _, y, _ in train}) < 2:  # pragma: no cover - needs 20+ of each kind all held out
        train = rows
    clf = LogisticRegression(C=4.0, solver="liblinear", random_state=seed, max_iter=1000)
    clf.fit(featurize([t for _, _, t in train]), np.array([y for _, y, _ in train]))
    model = QualityModel(np.asarray(clf.coef_[0], np.float64).copy(), float(clf.intercept_[0]))
    accuracy = auc = None
    if test:
        s = model.scores([t for _, _, t in test])
        truth = np.array([y == 1 for _, y, _ in test])
        accuracy = float(np.mean((s >= 0.5) == truth))
        if 0 < truth.sum() < truth.size:
            from sklearn.metrics import roc_auc_score

            auc = float(roc_auc_score(truth, s))
    from sklearn import __version__ as sk_version

    model.meta = {
        **(description or {}), "seed": seed, "features": {"analyzer": "char_wb", "ngram_range": list(NGRAM_RANGE),
                                                        "n_features": N_FEATURES, "max_chars": MAX_CHARS},
        "scikit_learn": sk_version, "held_out_accuracy": accuracy, "held_out_auc": auc,
        "held_out_documents": len(test),
        "train_documents": len(train), "positive_documents": len(positives), "negative_documents": len(negatives),
        "positive_sha256": sorted(h for h, y, _ in rows if y == 1),
        "negative_sha256": sorted(h for h, y, _ in rows if y == 0),
    }
    return model


def keep_cut(scores: list[np.ndarray], keep: float | None, threshold: float | None) -> tuple[float, list[np.ndarray]]:
    """Which scored documents to keep: (the threshold applied, a keep mask per shard).

    `scores[i]` holds shard i's scores, NaN where a document was already dropped. With `keep`
    (a fraction in (0, 1]) the top ceil(keep x scored) documents are kept (ties broken by position,
    so the count is exact); with `threshold`, every document scoring at least it. Exactly one of
    the two is given.
    """
    if (keep is None) == (threshold is None):
        raise ValueError("give exactly one of keep and threshold")
    flat = np.concatenate(scores) if scores else np.zeros(0)
    valid = ~np.isnan(flat)
    if keep is not None:
        n_keep = math.ceil(keep * int(valid.sum()))
        order = np.lexsort((np.arange(flat.size), -np.where(valid, flat, -np.inf)))
        kept_flat = np.zeros(flat.size, bool)
        kept_flat[order[:n_keep]] = True
        kept_flat &= valid
        cut = float(flat[order[n_keep - 1]]) if n_keep else 1.0
    else:
        cut = float(threshold) if threshold is not None else 0.0
        kept_flat = valid & (flat >= cut)
    out, start = [], 0
    for s in scores:
        out.append(kept_flat[start:start + s.size])
        start += s.size
    return cut, out


@dataclass
class QualityStep:
    """The recipe step `quality` (`--quality-reference`, `--quality-model`, `--quality-keep`,
    `--quality-threshold`): score every document the other steps kept with a classifier and keep
    the best. It is a recipe's last step (after dedup, as in DCLM); see
    `gptforge.data.phases.quality` for how it runs.
    """

    reference: str | None = None
    """Files or a folder of documents like the ones wanted (positives); read as prepare's inputs."""
    model: str | None = None
    """A classifier trained before (OUT/quality/model.npz of an earlier prepare) instead of reference."""
    keep: float | None = None
    """Fraction of the scored documents to keep, in (0, 1] (default 0.5 when threshold is not given)."""
    threshold: float | None = None
    """Keep the documents whose score (P(reference), in [0, 1]) is at least this, instead of keep."""
    seed: int = 0
    """Seed of the negatives' sample and of the classifier's training."""
    max_documents: int = 5000
    """At most this many reference documents, and as many negatives, train the classifier."""
    name: str = "quality"

    def check(self) -> None:
        """Raise ValueError naming the option (as prepare spells it) that is out of range or missing."""
        if (self.reference is None) == (self.model is None):
            raise ValueError("quality step: give exactly one of --quality-reference (documents to train on) and "
                             "--quality-model (a classifier trained before)")
        if self.keep is not None and self.threshold is not None:
            raise ValueError("quality step: give --quality-keep or --quality-threshold, not both")
        if self.keep is not None and not 0.0 < self.keep <= 1.0:
            raise ValueError(f"--quality-keep must be in (0, 1] (the fraction of documents kept), got {self.keep}")
        if self.threshold is not None and not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"--quality-threshold must be in [0, 1] (a probability), got {self.threshold}")
        if self.max_documents < MIN_REFERENCE_DOCUMENTS:
            raise ValueError(f"quality step: max_documents must be at least {MIN_REFERENCE_DOCUMENTS}, "
                             f"got {self.max_documents}")

    def cut(self) -> tuple[float | None, float | None]:
        """(keep, threshold) as `keep_cut` takes them: keep 0.5 when neither was given."""
        if self.keep is None and self.threshold is None:
            return 0.5, None
        return self.keep, self.threshold

    def training_options(self) -> dict[str, Any]:
        """What decides the classifier and the scores (not the cut): a rerun that changes only the
        cut reuses an earlier output's scores when these are the same."""
        return {"reference": self.reference, "model": self.model, "seed": self.seed,
                "max_documents": self.max_documents, "features": [NGRAM_RANGE, N_FEATURES, MAX_CHARS]}


def histogram(scores: np.ndarray, bins: int = 20) -> list[int]:
    """Counts of `scores` (NaN skipped) in `bins` equal bins over [0, 1]."""
    s = scores[~np.isnan(scores)]
    return np.histogram(s, bins=bins, range=(0.0, 1.0))[0].astype(int).tolist()
