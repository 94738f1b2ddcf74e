"""Size rule: no function in gptforge/ over 80 lines and no module over 600, so each reads on a
page and in one sitting; files are split by responsibility, never squeezed (no statements joined
by `;` to fit). A module over the limit is a named exception in ALLOWED with its reason, and an
exception no longer needed (the module is within the limits again, or gone) fails the test, so
the list only shrinks."""

import ast
import itertools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gptforge"
MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 600
ALLOWED: dict[str, str] = {}


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _rel(p: Path) -> str:
    return p.relative_to(PACKAGE.parent).as_posix()


def _long_functions(p: Path) -> list[str]:
    long = []
    for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            n = node.end_lineno - start + 1
            if n > MAX_FUNCTION_LINES:
                long.append(f"{_rel(p)}:{node.lineno} {node.name} ({n} lines)")
    return long


def _over_limits(p: Path) -> bool:
    return len(p.read_text(encoding="utf-8").splitlines()) > MAX_FILE_LINES or bool(_long_functions(p))


def test_no_module_over_600_lines():
    long = {_rel(p): n for p in _modules() if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES}
    assert not {k: v for k, v in long.items() if k not in ALLOWED}, (
        f"modules over {MAX_FILE_LINES} lines (split by responsibility): {long}")


def test_no_function_over_80_lines():
    long = [f for p in _modules() if _rel(p) not in ALLOWED for f in _long_functions(p)]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split by responsibility): {long}"


def test_each_exception_is_still_needed():
    for rel, reason in ALLOWED.items():
        path = PACKAGE.parent / rel
        assert reason.strip(), f"ALLOWED[{rel!r}] gives no reason"
        assert path.is_file(), f"ALLOWED names {rel}, which does not exist: remove it from the list"
        assert _over_limits(path), f"{rel} is within the limits again: remove it from ALLOWED"


def test_no_statements_squeezed_onto_one_line():
    squeezed = []
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            for field in ("body", "orelse", "finalbody"):
                stmts = getattr(node, field, None)
                if isinstance(stmts, list):
                    squeezed += [f"{_rel(p)}:{b.lineno}" for a, b in itertools.pairwise(stmts)
                                 if isinstance(a, ast.stmt) and isinstance(b, ast.stmt) and a.end_lineno == b.lineno]
    assert not squeezed, f"statements joined by ';' (split the file instead): {sorted(set(squeezed))}"


def test_command_modules_are_thin():
    long = {_rel(p): n for p in sorted((PACKAGE / "commands").glob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 150}
    assert not long, f"command modules over 150 lines (move the logic into its stage): {long}"
