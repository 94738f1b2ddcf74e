"""Imports point one way: every module imports only its own layer or lower ones (gptforge/__init__.py).

The graph is read from the source with `ast` (lazy imports inside functions count too), so a
module cannot hide an upward edge by importing late.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gptforge"

LAYERS = ["base", "model", "runtime", "data", "plan", "infer", "eval", "report", "train", "export", "serve",
          "commands"]
BASE = {"gptforge", "gptforge.atomic", "gptforge.config", "gptforge.presets", "gptforge.errors",
        "gptforge.progress"}
TOP = {"gptforge.cli", "gptforge.quickstart"}


def layer_of(module: str) -> int:
    """Index in LAYERS of a gptforge module name (or of a name imported from one)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in TOP:
            return LAYERS.index("commands")
        if n == 2 and parts[1] in LAYERS:
            return LAYERS.index(parts[1])
        if prefix in BASE:
            return 0
    raise AssertionError(f"module {module} belongs to no layer: add it to gptforge/__init__.py and LAYERS")


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[str, int]]:
    """(imported gptforge module, line) for every import statement in the file."""
    mod = module_name(path)
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            out.append((base, node.lineno))
    return [(m, line) for m, line in out if m == "gptforge" or m.startswith("gptforge.")]


def violations(edges: list[tuple[str, str, int]]) -> list[str]:
    """The edges (importer, imported, line) that break the order, each as a readable line."""
    bad = []
    for src, dst, line in edges:
        if dst.startswith("gptforge.commands"):
            bad.append(f"{src}:{line} imports {dst}: nothing imports commands (move the code into a stage)")
            continue
        a, b = layer_of(src), layer_of(dst)
        if b > a:
            bad.append(f"{src}:{line} ({LAYERS[a]}) imports {dst} ({LAYERS[b]}), a higher layer")
    return bad


def all_edges() -> list[tuple[str, str, int]]:
    return [(module_name(f), dst, line) for f in sorted(PACKAGE.rglob("*.py")) for dst, line in imports_of(f)]


def test_every_import_points_down():
    bad = violations(all_edges())
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def test_no_import_cycles_between_modules():
    graph: dict[str, set[str]] = {}
    modules = {module_name(f) for f in PACKAGE.rglob("*.py")}
    for src, dst, _ in all_edges():
        target = dst if dst in modules else dst.rsplit(".", 1)[0]
        if target in modules and target != src and target != "gptforge":
            graph.setdefault(src, set()).add(target)
    seen: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        seen[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if seen.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in seen and (cycle := visit(n)):
                return cycle
        stack.pop()
        seen[m] = 2
        return None

    for m in sorted(graph):
        if m not in seen and (cycle := visit(m)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


@pytest.mark.parametrize("src,dst", [
    ("gptforge.config", "gptforge.model.presets"),             # config <-> model
    ("gptforge.plan.measure", "gptforge.train.parallel.parallelize"),   # plan <-> train
    ("gptforge.train.workflows.finetune", "gptforge.export.hf"),         # train -> export
    ("gptforge.commands.finetune", "gptforge.commands.convert"),  # commands -> commands
    ("gptforge.eval.perplexity", "gptforge.train.run"),       # eval -> trainer for pick_device
    ("gptforge.infer.generate", "gptforge.train.run"),
    ("gptforge.runtime.checkpoint", "gptforge.train.workflows.finetune"),
    ("gptforge.model.gpt", "gptforge.data.loader"),
])
def test_the_edges_the_redesign_removed_would_fail(src, dst):
    assert violations([(src, dst, 1)]), f"{src} -> {dst} should break the order"


def test_downward_and_same_layer_edges_pass():
    assert not violations([("gptforge.train.run", "gptforge.runtime.device", 1),
                           ("gptforge.commands.pretrain", "gptforge.train.run", 1),
                           ("gptforge.model.qlora", "gptforge.model.lora", 1),
                           ("gptforge.data.shards", "gptforge", 1)])
