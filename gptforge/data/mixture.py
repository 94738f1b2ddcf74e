"""A seeded, stratified sampler of training sequences from several weighted sources.

Every optimizer step draws a global batch of `global_batch_size` sequences. How many come from
each source is apportioned per step against the cumulative target: after step s, source i has
given c_i sequences, where c_i is floor or ceil of w_i * G * (s + 1) (largest remainder on the
cumulative quota, never taking back what an earlier step gave). So |c_i - w_i * G * (s + 1)| < 1
at every step, and over any window of W steps the count of a source differs from w_i * G * W by
less than 2 sequences: with sequences of one length, its token fraction is within 2 / (W * G) of
w_i (under 1% absolute over 100 steps for any global batch of 2 sequences or more).

The global batch of a step is a function of (sources, weights, G, seed, step) alone, never of the
number of data-parallel ranks: rank r of dp takes the contiguous slice [r*G/dp, (r+1)*G/dp) of it.
Within a step the sources' sequences are interleaved (each spread evenly over the batch), so
every rank's slice is close to the mixture too.

Each source keeps its own epoch counter and order: its c-th sequence is entry c mod N_i of a
permutation of its N_i sequences, drawn anew for each epoch c // N_i from (seed, source name,
epoch). The sampler's state (step and per-source counts) is a small JSON-able dict for an exact
resume; any step can also be recomputed from step 0.

Repetition: Muennighoff et al. 2023 (Scaling Data-Constrained Language Models) found up to about
4 epochs of repeated data worth almost as much as new data, and rapidly less beyond:
`repetition_warnings` names each source whose weight makes it repeat more than that.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np

from gptforge.errors import InputError

MAX_USEFUL_EPOCHS = 4.0
"""Epochs of one source beyond which repetition is flagged (Muennighoff et al. 2023)."""


@dataclass(frozen=True)
class MixtureBatch:
    """The global batch of one optimizer step.

    items: G (source name, sequence index) pairs in batch order; counts: sequences per source in
    this step; epochs: each source's epoch (0-based) after this step's draws; totals: sequences
    per source drawn in steps 0..step.
    """

    step: int
    items: list[tuple[str, int]]
    counts: dict[str, int]
    epochs: dict[str, int]
    totals: dict[str, int]

    def rank_slice(self, dp_rank: int, dp_size: int) -> list[tuple[str, int]]:
        """Data-parallel rank `dp_rank`'s contiguous share of `items` (G / dp_size pairs).

        Raises:
            ValueError: G not divisible by dp_size, or dp_rank outside [0, dp_size).
        """
        g = len(self.items)
        if dp_size < 1 or not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank {dp_rank} is not a rank of dp_size {dp_size}")
        if g % dp_size:
            raise ValueError(f"global batch of {g} sequences does not split over {dp_size} data-parallel ranks; "
                             "make train.global_batch_size a multiple of the number of ranks")
        per = g // dp_size
        return self.items[dp_rank * per : (dp_rank + 1) * per]


def normalize_weights(weights: dict[str, float], sources: list[str]) -> dict[str, float]:
    """Weights over exactly `sources`, each >= 0, scaled to sum to 1, in the order of `sources`.

    Raises:
        ValueError: a weight for an unknown source (naming the nearest source name), a source
            without a weight, a negative or non-finite weight, or all weights 0.
    """
    for name in weights:
        if name not in sources:
            near = difflib.get_close_matches(name, sources, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ValueError(f"data weight for unknown source {name!r}{hint}; the sources are {', '.join(sources)}")
    missing = [s for s in sources if s not in weights]
    if missing:
        raise ValueError(f"no data weight for source(s) {', '.join(missing)}; give every source a weight "
                         "(0 leaves a source out)")
    for name, w in weights.items():
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"data weight {name}={w!r}: must be a finite number >= 0")
    total = sum(weights[s] for s in sources)
    if total <= 0:
        raise ValueError("every data weight is 0: give at least one source a positive weight")
    return {s: weights[s] / total for s in sources}


def proportional_weights(sizes: dict[str, int]) -> dict[str, float]:
    """Weights proportional to each source's size (e.g. its train tokens), summing to 1.

    Raises:
        ValueError: no source, or every size 0.
    """
    total = sum(sizes.values())
    if not sizes or total <= 0:
        raise ValueError("proportional weights need at least one source with a positive size")
    return {name: n / total for name, n in sizes.items()}


def _name_key(name: str) -> int:
    """A stable 64-bit key of a source name (not Python's per-process salted hash)."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "little")


class MixtureSampler:
    """Deterministic stratified sampling of sequence indices from weighted sources.

    Args:
        sizes: sequences per epoch of each source (name -> N_i >= 1), in a fixed order.
        weights: name -> weight >= 0 (normalized here; see `normalize_weights`).
        global_batch_size: G, sequences per optimizer step over all data-parallel ranks.
        seed: seeds every source's per-epoch order.
        stages: ordered (until_step, weights): steps below until_step (and at or above the stage
            before's) draw with that stage's weights; steps after the last stage with `weights`.
            The quota is cumulative over steps, each step adding its own weights x G, so the
            counts stay within one sequence of it across a stage boundary too.

    Raises:
        ValueError: no source, a size < 1, G < 1, bad weights (see `normalize_weights`), or stage
            ends that do not increase.
    """

    def __init__(self, sizes: dict[str, int], weights: dict[str, float], global_batch_size: int, seed: int,
                 stages: list[tuple[int, dict[str, float]]] | None = None):
        if not sizes:
            raise ValueError("a mixture needs at least one source")
        for name, n in sizes.items():
            if int(n) < 1:
                raise ValueError(f"source {name!r} has {n} sequences; each source needs at least one")
        if global_batch_size < 1:
            raise ValueError(f"global_batch_size must be >= 1, got {global_batch_size}")
        self.names = list(sizes)
        self.sizes = {k: int(v) for k, v in sizes.items()}
        self.weights = normalize_weights(dict(weights), self.names)
        self.global_batch_size, self.seed = int(global_batch_size), int(seed)
        self.stages = [(int(until), normalize_weights(dict(w), self.names)) for until, w in (stages or [])]
        if any(b[0] <= a[0] for a, b in pairwise(self.stages)) or any(u < 1 for u, _ in self.stages):
            raise ValueError(f"mixture stages must end at increasing steps >= 1, got {[u for u, _ in self.stages]}")
        self._w = np.array([self.weights[s] for s in self.names], dtype=np.float64)
        self._stage_w = [np.array([w[s] for s in self.names], dtype=np.float64) for _, w in self.stages]
        self._perms: dict[tuple[str, int], np.ndarray] = {}
        self._reset()

    def _reset(self) -> None:
        self._last: MixtureBatch | None = None
        self.step = 0
        self.counts = {s: 0 for s in self.names}
        self._target = np.zeros(len(self.names), dtype=np.float64)  # cumulative quota before self.step

    def weights_at(self, step: int) -> dict[str, float]:
        """The normalized weights of optimizer step `step`: its stage's, else `weights`."""
        w = self._weights_array(step)
        return {s: float(w[i]) for i, s in enumerate(self.names)}

    def _weights_array(self, step: int) -> np.ndarray:
        for (until, _), w in zip(self.stages, self._stage_w, strict=True):
            if step < until:
                return w
        return self._w

    # -- apportionment ------------------------------------------------------------------------

    def _step_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Sequences per source for step `self.step`, from the cumulative quota (module docstring)."""
        g = self.global_batch_size
        target = self._target + self._weights_array(self.step) * g
        have = np.array([self.counts[s] for s in self.names], dtype=np.int64)
        after = np.maximum(have, np.floor(target + 1e-9).astype(np.int64))
        left = g * (self.step + 1) - int(after.sum())
        if left < 0:  # cannot happen while every count is floor or ceil of its quota
            raise RuntimeError(f"mixture apportionment overflow at step {self.step}: {after.tolist()} > {target.tolist()}")
        # Largest remainders first; ties to the earlier source, so the result is deterministic.
        order = sorted(range(len(self.names)), key=lambda i: (-round(float(target[i] - after[i]), 9), i))
        for i in order[:left]:
            after[i] += 1
        return after - have, target

    def _advance(self) -> np.ndarray:
        """Draw step `self.step`'s counts only (no indices): the fast path of skipping ahead."""
        per_source, self._target = self._step_counts()
        self.counts = {s: self.counts[s] + int(per_source[i]) for i, s in enumerate(self.names)}
        self.step += 1
        return per_source

    def _interleave(self, per_source: np.ndarray) -> list[int]:
        """Source positions of one step's G slots: each source's draws spread evenly over the batch."""
        keys = []
        for i, n in enumerate(per_source.tolist()):
            keys += [((q + 0.5) / n, i) for q in range(n)]
        return [i for _, i in sorted(keys)]

    def _index(self, name: str, c: int) -> int:
        """Sequence index of `name`'s c-th draw (0-based): entry c mod N of epoch c // N's order."""
        n = self.sizes[name]
        epoch = c // n
        perm = self._perms.get((name, epoch))
        if perm is None:
            # Keep only the current epoch's order of each source.
            self._perms = {k: v for k, v in self._perms.items() if k[0] != name}
            rng = np.random.default_rng([self.seed & (2**63 - 1), _name_key(name), epoch])
            perm = self._perms[(name, epoch)] = rng.permutation(n)
        return int(perm[c % n])

    def _draw(self) -> MixtureBatch:
        next_q = dict(self.counts)
        per_source = self._advance()
        items = []
        for i in self._interleave(per_source):
            name = self.names[i]
            items.append((name, self._index(name, next_q[name])))
            next_q[name] += 1
        batch = MixtureBatch(step=self.step - 1, items=items,
                             counts={s: int(per_source[i]) for i, s in enumerate(self.names)},
                             epochs={s: next_q[s] // self.sizes[s] for s in self.names}, totals=dict(next_q))
        self._last = batch
        return batch

    # -- public API ---------------------------------------------------------------------------

    def global_batch(self, step: int) -> MixtureBatch:
        """The global batch of optimizer step `step` (0-based).

        Steps run forward from the sampler's state (skipping ahead draws the skipped steps); the
        last step drawn can be asked for again; an earlier step is recomputed from step 0.

        Raises:
            ValueError: a negative step.
        """
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if self._last is not None and self._last.step == step:
            return self._last
        if step < self.step:
            self._reset()
        while self.step < step:
            self._advance()
        return self._draw()

    def epochs(self) -> dict[str, int]:
        """Each source's current epoch (0-based): completed passes over its sequences."""
        return {s: self.counts[s] // self.sizes[s] for s in self.names}

    def planned_epochs(self, max_steps: int) -> dict[str, float]:
        """Epochs of each source that `max_steps` steps draw: sum over steps of w_i(step) * G / N_i."""
        total = np.zeros(len(self.names))
        lo = 0
        for (until, _), w in zip(self.stages, self._stage_w, strict=True):
            total += w * max(0, min(until, max_steps) - lo)
            lo = until
        total += self._w * max(0, max_steps - lo)
        g = self.global_batch_size
        return {s: float(total[i]) * g / self.sizes[s] for i, s in enumerate(self.names)}

    def repetition_warnings(self, max_steps: int) -> list[str]:
        """One line per source that `max_steps` steps would repeat more than MAX_USEFUL_EPOCHS times."""
        out = []
        for name, e in self.planned_epochs(max_steps).items():
            if e > MAX_USEFUL_EPOCHS:
                out.append(f"WARNING: source {name!r} ({self.sizes[name]:,} sequences, weight {self.weights[name]:.3g}) "
                           f"repeats {e:.1f} epochs in {max_steps:,} steps, more than {MAX_USEFUL_EPOCHS:g}: beyond "
                           "about 4 epochs repeated data is worth much less than new data (Muennighoff et al. 2023); "
                           "lower its weight or add data to it")
        return out

    def state_dict(self) -> dict:
        """The position to resume from (JSON-able): next step, per-source draws, and what they mean."""
        return {"step": self.step, "counts": dict(self.counts), "target": [float(t) for t in self._target],
                "sizes": dict(self.sizes), "weights": dict(self.weights), "stages": [[u, w] for u, w in self.stages],
                "global_batch_size": self.global_batch_size, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state_dict()` output: the next `global_batch` calls give the batches the
        saved sampler would have given.

        Raises:
            ValueError: the state belongs to other sources, sizes, weights, batch size or seed (names the field).
        """
        for key, mine in (("sizes", self.sizes), ("global_batch_size", self.global_batch_size), ("seed", self.seed)):
            if state.get(key) != mine:
                raise ValueError(f"mixture state: {key} {state.get(key)!r} differs from this run's {mine!r}; "
                                 "resume with the data and batch the run started with")
        saved_w = state.get("weights") or {}
        if set(saved_w) != set(self.weights) or any(abs(saved_w[s] - self.weights[s]) > 1e-12 for s in saved_w):
            raise ValueError(f"mixture state: weights {saved_w} differ from this run's {self.weights}")
        if [[int(u), dict(w)] for u, w in state.get("stages") or []] != [[u, w] for u, w in self.stages]:
            raise ValueError(f"mixture state: stages {state.get('stages')} differ from this run's {self.stages}")
        counts = {s: int(state["counts"][s]) for s in self.names}
        self.step, self.counts, self._last = int(state["step"]), counts, None
        self._target = np.array(state["target"], dtype=np.float64)


def mixture_folders(data: str | Path | list) -> dict[str, Path] | None:
    """The sources of `data` (name -> shard folder), or None for one plain shard folder.

    Several folders: named by their folder names. One folder whose meta.json lists `sources`
    (`gptforge prepare --source`): those, each under the folder.

    Raises:
        InputError: two folders of the same name.
    """
    dirs = [Path(d) for d in (data if isinstance(data, (list, tuple)) else [data])]
    if len(dirs) == 1:
        meta = dirs[0] / "meta.json"
        sources = json.loads(meta.read_text()).get("sources") if meta.is_file() else None
        if not sources:
            return None
        return {s["name"]: dirs[0] / s.get("path", s["name"]) for s in sources}
    out: dict[str, Path] = {}
    for d in dirs:
        if d.name in out:
            raise InputError(f"--data: {out[d.name]} and {d} have the same folder name {d.name!r}, which names a "
                             "source; rename one of them")
        out[d.name] = d
    return out
