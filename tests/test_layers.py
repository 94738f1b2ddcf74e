"""Imports point one way: every module imports only its own layer or lower ones (gptforge/__init__.py).

The graph is read from the source with `ast` (lazy imports inside functions count too), so a
module cannot hide an upward edge by importing late. The layers and their modules are read from
the table in `gptforge/__init__.py`'s docstring: a module that table does not place fails the test.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gptforge"


def layer_table(doc: str) -> dict[str, str]:
    """{layer name: its description} from the indented rows of the package docstring's table."""
    rows = re.findall(r"^    ([a-z]+) {2,}(.+)$", doc, flags=re.M)
    return dict(rows)


TABLE = layer_table(ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text())) or "")
LAYERS = list(TABLE)
# The base row names modules ("gptforge (this file), atomic, config, ..."); the commands row names,
# in parentheses, the modules outside gptforge/commands/ that belong to it.
BASE = {"gptforge"} | {f"gptforge.{name.strip()}" for name in TABLE.get("base", "").split(",")[1:]}
TOP = {name.strip() for name in re.findall(r"\((.*)\)", TABLE.get("commands", ""))[0].split(",")
       if not name.strip().endswith("*")} if "commands" in TABLE else set()


def layer_of(module: str) -> int:
    """Index in LAYERS of a gptforge module name (or of a name imported from one).

    Raises AssertionError for a module the layer table does not place: a module directly under
    gptforge/ that the base or commands row does not name, or a package that is no row.
    """
    parts = module.split(".")
    if module == "gptforge":
        return 0
    if len(parts) >= 2:
        top = ".".join(parts[:2])
        if top in TOP:
            return LAYERS.index("commands")
        if top in BASE:
            return 0
        if parts[1] in LAYERS and parts[1] != "base":
            return LAYERS.index(parts[1])
    raise AssertionError(f"module {module} belongs to no layer: add it to the layer table in gptforge/__init__.py")


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(base: str, names: list[str]) -> list[str]:
    """The modules `from base import names` reads: base.name for each name that is a module of the
    package (so `from gptforge import options` counts as gptforge.options), else base itself."""
    out = []
    for name in names:
        sub = PACKAGE.parent.joinpath(*f"{base}.{name}".split("."))
        is_module = sub.with_suffix(".py").is_file() or (sub / "__init__.py").is_file()
        out.append(f"{base}.{name}" if is_module else base)
    return sorted(set(out))


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
            out += [(name, node.lineno) for name in imported_modules(base, [a.name for a in node.names])]
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


def test_every_module_belongs_to_a_layer():
    unplaced = []
    for f in sorted(PACKAGE.rglob("*.py")):
        try:
            layer_of(module_name(f))
        except AssertionError as e:
            unplaced.append(str(e))
    assert not unplaced, "\n".join(unplaced)


def test_the_table_names_every_layer_in_order():
    assert LAYERS == ["base", "model", "runtime", "data", "plan", "infer", "eval", "report", "train", "export",
                      "serve", "commands"]
    assert {"gptforge.options", "gptforge.config", "gptforge.atomic"} <= BASE
    assert TOP == {"gptforge.cli", "gptforge.quickstart"}


@pytest.mark.parametrize("module", ["gptforge.nowhere", "gptforge.nowhere.inner", "gptforge.base"])
def test_a_module_the_table_does_not_place_fails(module):
    with pytest.raises(AssertionError, match="belongs to no layer"):
        layer_of(module)


def test_from_package_import_module_is_an_edge_to_that_module():
    assert imported_modules("gptforge", ["options", "__version__"]) == ["gptforge", "gptforge.options"]
    assert imported_modules("gptforge.train", ["run"]) == ["gptforge.train.run"]
    assert violations([("gptforge.config", "gptforge.train.run", 1)])
