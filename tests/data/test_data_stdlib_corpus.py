"""The standard-library corpus: real .py sources, no test suites, deterministic order."""

from __future__ import annotations

from gptforge.data.stdlib_corpus import stdlib_files, stdlib_root


def test_stdlib_files():
    root = stdlib_root()
    files = stdlib_files()
    rel = [p.relative_to(root).as_posix() for p in files]
    assert len(files) > 200
    assert "json/decoder.py" in rel and "collections/__init__.py" in rel
    assert all(r.endswith(".py") for r in rel)
    for r in rel:
        parts = r.split("/")
        assert not {"test", "tests", "idle_test", "site-packages"} & set(parts[:-1]), r
        assert not parts[-1].startswith("test_"), r
    assert rel == sorted(rel) and stdlib_files() == files
    # Real prose is in there: module docstrings.
    assert '"""' in (root / "json" / "decoder.py").read_text(encoding="utf-8")
