"""A real-text corpus every Python installation ships: the standard library's source files.

Python source with its docstrings and comments is English prose mixed with code: enough for a
small model to learn visibly on a CPU, with no download. Test suites are left out (they are
large, repetitive and full of deliberately odd strings), as are third-party packages.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

#: folder names whose contents are test suites or installed third-party packages.
EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages",
                           "__pycache__", "testing", "unittest_test"})


def stdlib_root() -> Path:
    """The standard library folder of the running interpreter (`sysconfig` "stdlib" path).

    Raises:
        FileNotFoundError: this interpreter ships no standard library sources (e.g. a frozen
            or zip-only install).
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise FileNotFoundError(f"the standard library folder {root} reported by sysconfig does not exist")
    return root


def stdlib_files(root: str | Path | None = None) -> list[Path]:
    """The standard library's `.py` files, test folders and site-packages excluded.

    Returns absolute paths sorted by their path relative to the standard library root, so the
    order is the same on every run and machine with the same Python version.

    Raises:
        FileNotFoundError: as `stdlib_root`, or no `.py` file found.
    """
    root = Path(root) if root is not None else stdlib_root()
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if any(part in EXCLUDED_DIRS or part.startswith(".") for part in rel.parts[:-1]):
            continue
        if rel.name.startswith("test_") or rel.name == "conftest.py":
            continue
        if path.is_file():
            files.append((rel.as_posix(), path))
    if not files:
        raise FileNotFoundError(f"no .py files under {root}")
    return [p for _, p in sorted(files)]
