"""Every command reports bad input as one `gptforge COMMAND: error: ...` line naming the path, with no
traceback unless --debug."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _gptforge(*args, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "gptforge.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.mark.parametrize("args,where", [
    (["generate", "/nonexistent/run"], "/nonexistent/run"),
    (["evaluate", "/nonexistent/run", "--text", "/nonexistent/t.txt"], "/nonexistent"),
    (["convert", "--to-hf", "/nonexistent/run", "--out", "/tmp/x-never"], "/nonexistent/run"),
    (["pretrain", "--data", "/nonexistent/shards", "--out", "RUNDIR"], "/nonexistent/shards"),
    (["prepare", "/nonexistent/corpus.txt", "--out", "OUTDIR"], "/nonexistent/corpus.txt"),
    (["export-checkpoint", "/nonexistent/run", "--out", "/tmp/x-never.safetensors"], "/nonexistent/run"),
])
def test_one_error_format_across_commands(args, where, tmp_path):
    args = [str(tmp_path / a) if a in ("RUNDIR", "OUTDIR") else a for a in args]
    proc = _gptforge(*args, timeout=120)
    assert proc.returncode in (1, 2), proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert lines and lines[-1].startswith(f"gptforge {args[0]}: error: "), proc.stderr
    assert where in proc.stderr
    assert "Traceback" not in proc.stderr


def test_debug_shows_the_traceback():
    proc = _gptforge("--debug", "generate", "/nonexistent/run", timeout=120)
    assert proc.returncode != 0 and "Traceback" in proc.stderr



def test_gptforge_warnings_are_one_plain_line(capsys):
    """A UserWarning raised in gptforge's own code (rows skipped, pairs dropped) is printed as
    `gptforge NAME: warning: ...`, without Python's file:line and source line; others as Python does."""
    import os
    import warnings

    from gptforge.cli import run_command

    here = os.sep + os.path.join("x", "gptforge", "data", "preference.py")

    def fn(argv):
        warnings.warn_explicit("pairs.jsonl: dropped 1 of 2 pair(s) longer than block_size 128", UserWarning, here, 50)
        warnings.warn_explicit("from elsewhere", UserWarning, os.sep + os.path.join("x", "lib", "other.py"), 7)
        return 0

    with pytest.warns(UserWarning, match="from elsewhere") as caught:  # passed on to Python's (here pytest's) handler
        assert run_command("finetune", fn, []) == 0
    assert len(caught) == 1
    err = capsys.readouterr().err
    assert err == "gptforge finetune: warning: pairs.jsonl: dropped 1 of 2 pair(s) longer than block_size 128\n"
