"""The trainer and the resolver read sources, batches, objectives and components through their
declared protocols only: no `hasattr`, `getattr`, `setattr` or `isinstance` probes (read with `ast`).

A member the trainer needs belongs in the protocol (gptforge.train.sources.base.BatchSource,
gptforge.train.objectives.base.Objective) with its default in `SourceBase` / `BatchesBase` /
`ObjectiveBase`, never behind a probe.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TRAIN = Path(__file__).resolve().parents[2] / "gptforge" / "train"
PROBES = {"hasattr", "getattr", "setattr", "isinstance"}
# resolve.py checks the types of config values (train.compile may be a bool or "auto"); those
# are config fields, not members of a source, batch, objective or component.
CONFIG_NAMES = {"tc", "pc", "mc", "cfg", "pre", "user", "kept", "saved", "saved_train"}


def _root(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def probes(path: Path, allowed_roots: set[str]) -> list[str]:
    """'line: call' of every probe call in `path` whose first argument is not rooted at one of
    `allowed_roots` (hasattr and setattr are never allowed)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in PROBES):
            continue
        name = node.func.id
        root = _root(node.args[0]) if node.args else None
        if name in ("hasattr", "setattr") or root not in allowed_roots:
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_trainer_never_probes():
    assert probes(TRAIN / "trainer.py", set()) == []


def test_the_resolver_probes_config_values_only():
    assert probes(TRAIN / "resolve.py", CONFIG_NAMES) == []


@pytest.mark.parametrize("code, hit", [
    ("x = getattr(self.source, 'source_tokens', None)", True),
    ("ok = hasattr(self.batches, 'step_metrics')", True),
    ("f = lambda r: setattr(self, 'stopped', r)", True),
    ("if isinstance(source, ShardSource): pass", True),
    ("if isinstance(tc.compile, bool): pass", False),
])
def test_the_check_finds_what_it_looks_for(tmp_path, code, hit):
    """The walker itself: each probe the issue named is found; a config check is not."""
    f = tmp_path / "m.py"
    f.write_text(code + "\n")
    assert bool(probes(f, CONFIG_NAMES)) is hit
