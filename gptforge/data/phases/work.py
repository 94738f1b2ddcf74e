"""`WorkFolder`: the one owner of prepare's work folder (`.OUT.work` beside the output).

Every intermediate result of prepare is a file here, written atomically (`gptforge.atomic`) and
named by its phase and shard, so that a killed run resumes from what is done. A shard's result
of a phase is done when its stats file `PHASE/NNNNN.json` exists (it is written last); a corpus
step's verdict is done when `STEP/done.json` exists. Layout:

    fingerprint.json              what the results depend on (`fingerprint_of`); another -> start over
    KEYPASS/NNNNN.KEY.npy, .json  a corpus step's key pass (e.g. `boilerplate_keys/`)
    curate/NNNNN.arrow            the curated documents of shard NNNNN (Arrow IPC: id, split key, text)
    curate/NNNNN.KEY.npy          the last corpus step's keys (dedup: exact, bands)
    curate/NNNNN.json             the shard's counts (read, normalize, every step)
    STEP/...                      a corpus step's verdict (`boilerplate/keys.npy`, `dedup/NNNNN.npy`), done.json
    tokenizer_sample/NNNNN.arrow  a shard's part of the tokenizer's training sample (column piece), .json
    tokenizer.json                the trained tokenizer (given_tokenizer.json: a copy of --tokenizer)
    encode-KEY/NAME.SPLIT.npy     token ids per shard (or window) and split, NAME.json counts
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gptforge.atomic import atomic_path, atomic_save_npy, atomic_write_json

log = logging.getLogger("gptforge.data")

#: 2: FineWeb text simplification and short-document rule in near dedup; 3: byte-range shards;
#: 4: split keys independent of the corpus's location (`phases.split.split_key`), a key column.
WORK_FORMAT_VERSION = 4


def fingerprint_of(files: Sequence[Path], options: dict[str, Any]) -> dict[str, Any]:
    """What the work folder's results depend on: the files (name, size, mtime) and options."""
    h = hashlib.sha256()
    for f in files:
        h.update(str(f).encode("utf-8", "surrogatepass"))
        try:
            st = os.stat(f)
            h.update(f"\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(b"\0-\n")
    return {"work_format_version": WORK_FORMAT_VERSION, "files_sha256": h.hexdigest(), "files": len(files),
            "options": options}


def fingerprint_difference(old: Any, new: dict[str, Any]) -> str:
    """What differs between two fingerprints, in words ("other options (vocab_size: 400 -> 300)")."""
    if not isinstance(old, dict):
        return "no readable fingerprint"
    parts = []
    if old.get("work_format_version") != new.get("work_format_version"):
        parts.append("another gptforge version")
    if old.get("files_sha256") != new.get("files_sha256") or old.get("files") != new.get("files"):
        parts.append("other input files (names, sizes or times)")
    a, b = old.get("options") or {}, new.get("options") or {}
    changed = [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b), key=str) if a.get(k) != b.get(k)]
    if changed:
        shown = [c if len(c) < 120 else c[:117] + "..." for c in changed]
        parts.append(f"other options ({'; '.join(shown)})")
    return ", ".join(parts) or "another fingerprint"


class WorkFolder:
    """Paths, done markers and atomic writes of one prepare work folder (see the module docstring).

    Workers get the folder as a string in their task and make their own `WorkFolder(path)`.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)

    @classmethod
    def for_output(cls, out_dir: Path) -> WorkFolder:
        """The work folder of an output folder: hidden, beside it (so a crash never touches `out`)."""
        return cls(out_dir.parent / f".{out_dir.name}.work")

    # ---- the folder as a whole ----

    def open(self, fingerprint: dict[str, Any]) -> bool:
        """Create the folder, or reuse it when it was made for the same `fingerprint`.

        A folder from different inputs or options is deleted first (its results would be wrong
        for this run); a reused one loses the half-written temp files of the run that left it.
        Returns True when earlier results are reused.
        """
        marker = self.root / "fingerprint.json"
        if self.root.is_dir():
            try:
                old = json.loads(marker.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                old = None
            if old == fingerprint:
                self.remove_partial_files()
                return True
            log.warning(f"{self.root}: left by a run with {fingerprint_difference(old, fingerprint)}; starting over")
            shutil.rmtree(self.root)
        self.root.mkdir(parents=True)
        self.write_json(marker, fingerprint)
        return False

    def remove_partial_files(self) -> None:
        """Half-written temp files (`.NAME.XXXX.tmp*`): a dead run's debris."""
        for p in self.root.rglob(".*.tmp*"):
            if p.is_file():
                p.unlink(missing_ok=True)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    # ---- paths and done markers ----

    def phase_dir(self, phase: str) -> Path:
        """`ROOT/PHASE/`, created on first use."""
        d = self.root / phase
        d.mkdir(exist_ok=True)
        return d

    def step_dir(self, step_name: str) -> Path:
        """The folder of a corpus step's verdict."""
        return self.phase_dir(step_name)

    def shard_file(self, phase: str, index: int, suffix: str) -> Path:
        """`ROOT/PHASE/NNNNN<suffix>`."""
        return self.phase_dir(phase) / f"{index:05d}{suffix}"

    def shard_done(self, phase: str, index: int) -> bool:
        """Whether shard `index` of `phase` is done (its stats file, written last, exists)."""
        return (self.root / phase / f"{index:05d}.json").exists()

    def shard_stats(self, phase: str, index: int) -> dict[str, Any]:
        """The stats file of shard `index` of `phase`."""
        return self.read_json(self.shard_file(phase, index, ".json"))

    def read_json(self, path: Path) -> Any:
        return json.loads(path.read_text(encoding="utf-8"))

    def key_files(self, phase: str, index: int, names: Sequence[str]) -> dict[str, Path]:
        """{key name: `PHASE/NNNNN.KEY.npy`} of one shard."""
        return {k: self.shard_file(phase, index, f".{k}.npy") for k in names}

    def curated(self, index: int) -> Path:
        """The curated documents of shard `index` (Arrow IPC file: id, key (the split key), text)."""
        return self.shard_file("curate", index, ".arrow")

    def drop_mask(self, step_name: str, index: int) -> np.ndarray:
        """The drop mask of curated shard `index` from a corpus step that drops by mask."""
        return np.load(self.step_dir(step_name) / f"{index:05d}.npy")

    def tokenizer_path(self, given: bool) -> Path:
        return self.root / ("given_tokenizer.json" if given else "tokenizer.json")

    def encode_dir(self, key: str) -> Path:
        return self.phase_dir(f"encode-{key}")

    # ---- atomic writes ----

    def write_json(self, path: Path, obj: Any) -> None:
        atomic_write_json(path, obj, indent=1)

    def save_npy(self, path: Path, array: np.ndarray) -> None:
        atomic_save_npy(path, array)

    def arrow_writer(self, path: Path):
        """`gptforge.atomic.atomic_path` for a file an Arrow writer fills."""
        return atomic_path(path)

    # ---- reading curated shards ----

    def documents(self, index: int, mask: np.ndarray | None = None,
                  columns: Sequence[str] = ("id", "key", "text")) -> Iterator[tuple[int, dict[str, Any]]]:
        """(position in shard, {column: value}) of a curated shard's documents not dropped by `mask`.

        A column the shard does not hold (`language` in a shard written before it existed) reads None.
        """
        import pyarrow as pa

        with pa.memory_map(str(self.curated(index))) as source:
            reader = pa.ipc.open_file(source)
            pos = 0
            for b in range(reader.num_record_batches):
                batch = reader.get_batch(b)
                names = set(batch.schema.names)
                cols = [batch.column(c).to_pylist() if c in names else [None] * batch.num_rows for c in columns]
                for j in range(batch.num_rows):
                    if mask is None or not mask[pos]:
                        yield pos, {c: cols[k][j] for k, c in enumerate(columns)}
                    pos += 1

    def text_lengths(self, index: int) -> np.ndarray:
        """Characters of each document of a curated shard, shape (documents,)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        with pa.memory_map(str(self.curated(index))) as source:
            table = pa.ipc.open_file(source).read_all()
            if table.num_rows == 0:
                return np.zeros(0, np.int64)
            return pc.utf8_length(table.column("text")).to_numpy(zero_copy_only=False).astype(np.int64)

    def documents_at(self, offsets: np.ndarray, positions: set[int]) -> dict[int, tuple[str, str]]:
        """{global position: (id, text)} for a few documents (`offsets`: each shard's first position)."""
        found: dict[int, tuple[str, str]] = {}
        for p in sorted(positions):
            shard = int(np.searchsorted(offsets, p, side="right") - 1)
            for pos, d in self.documents(shard):
                if pos == p - offsets[shard]:
                    found[p] = (d["id"], d["text"])
                    break
        return found
