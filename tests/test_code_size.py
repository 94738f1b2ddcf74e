"""Size rule: no function in gptforge/ over 80 lines and no module over 600, so each reads on a
page and in one sitting. Tables of data (presets, hardware) may be longer: they are listed in
ALLOWED with the reason; a config dataclass is code, not a table (gptforge/config/ is split by
section instead)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gptforge"
MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 600
ALLOWED: dict[str, str] = {
    # "gptforge/plan/hardware.py": "the GPU table",  (no table is over the limit today)
}


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _rel(p: Path) -> str:
    return p.relative_to(PACKAGE.parent).as_posix()


def test_no_module_over_600_lines():
    long = {_rel(p): n for p in _modules() if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES}
    assert not {k: v for k, v in long.items() if k not in ALLOWED}, (
        f"modules over {MAX_FILE_LINES} lines (split by responsibility): {long}")


def test_no_function_over_80_lines():
    long = []
    for p in _modules():
        if _rel(p) in ALLOWED:
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                n = node.end_lineno - start + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{_rel(p)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split by responsibility): {long}"


def test_allow_list_names_real_modules():
    for rel in ALLOWED:
        assert (PACKAGE.parent / rel).is_file(), f"ALLOWED names {rel}, which does not exist"


def test_command_modules_are_thin():
    long = {_rel(p): n for p in sorted((PACKAGE / "commands").glob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 150}
    assert not long, f"command modules over 150 lines (move the logic into its stage): {long}"
