"""A tiny GPT trained a few steps on standard-library shards, and task files cut from real text."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.conftest import load_nano_run, train_nano_run


@pytest.fixture(scope="session")
def trained_run(tiny_shards, tmp_path_factory) -> Path:
    """A run directory: gpt2-nano (2 layers, d_model 64), block 64, 40 steps on `tiny_shards`."""
    return train_nano_run(tiny_shards, tmp_path_factory.mktemp("evalrun") / "run", checkpoint_interval=0)


@pytest.fixture(scope="session")
def loaded(trained_run):
    """(model in eval mode on CPU, Tokenizer) of `trained_run`."""
    return load_nano_run(trained_run)


def source_lines(n: int, seed: int = 0) -> list[str]:
    """`n` distinct non-trivial lines of real Python source (from this repository's stdlib sample)."""
    from tests.conftest import stdlib_sample_files

    lines = []
    for f in stdlib_sample_files(20):
        for line in f.read_text(encoding="utf-8", errors="replace").splitlines():
            s = line.strip()
            if 25 <= len(s) <= 70 and " " in s and s not in lines:
                lines.append(s)
    random.Random(seed).shuffle(lines)
    return lines[:n]


def write_mc_task(path: Path, n: int = 24, n_choices: int = 4, seed: int = 0) -> Path:
    """A multiple-choice jsonl: the first half of a source line, the true second half among
    second halves of other lines (so a model trained on source code beats chance)."""
    lines = source_lines(n * n_choices, seed)
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        group = lines[i * n_choices:(i + 1) * n_choices]
        halves = [(s[: len(s) // 2], s[len(s) // 2:]) for s in group]
        ctx = halves[0][0]
        choices = [h[1] for h in halves]
        order = list(range(n_choices))
        rng.shuffle(order)
        rows.append({"context": ctx, "choices": [choices[o] for o in order], "label": order.index(0)})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path
