"""--overwrite replaces only what gptforge wrote; evaluate --out stays out of a run's own files
(issue 41 item 6)."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from gptforge.data.prepare import PrepareConfig, prepare
from gptforge.data.prepare_sources import prepare_sources
from gptforge.errors import InputError

WORDS = "the river city garden market school teacher children morning winter summer bridge station".split()


def _src(root):
    rng = random.Random(1)
    d = root / "src"
    d.mkdir()
    for k in range(12):
        (d / f"{k}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(100)) + ".", encoding="utf-8")
    return d


def test_prepare_overwrite_refuses_a_folder_gptforge_did_not_write(tmp_path):
    src = _src(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    cfg = dict(inputs=[str(src)], recipe="none", vocab_size=300, workers=1, overwrite=True)
    with pytest.raises(FileExistsError, match="not written by gptforge prepare"):
        prepare(PrepareConfig(out=str(mine), **cfg), show_progress=False)
    with pytest.raises(FileExistsError, match="not written by gptforge prepare"):
        prepare_sources(PrepareConfig(out=str(mine), **{**cfg, "inputs": []}), {"a": [str(src)]}, show_progress=False)
    assert (mine / "thesis.tex").read_text() == "years of work"
    # Its own output is replaced, and an empty folder is used.
    (tmp_path / "empty").mkdir()
    prepare(PrepareConfig(out=str(tmp_path / "empty"), **cfg), show_progress=False)
    prepare(PrepareConfig(out=str(tmp_path / "empty"), **{**cfg, "vocab_size": 320}), show_progress=False)
    prepare_sources(PrepareConfig(out=str(tmp_path / "mix"), **{**cfg, "inputs": []}), {"a": [str(src)]},
                    show_progress=False)
    prepare_sources(PrepareConfig(out=str(tmp_path / "mix"), **{**cfg, "inputs": [], "vocab_size": 320}),
                    {"a": [str(src)]}, show_progress=False)


def test_export_overwrite_refuses_a_folder_gptforge_did_not_write(tmp_path):
    from gptforge.export.common import check_export_out, mark_export

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(InputError, match="not written by gptforge export"):
        check_export_out(tmp_path / "run", mine, True)
    mark_export(mine)
    check_export_out(tmp_path / "run", mine, True)  # a folder an export wrote: replaced
    (tmp_path / "empty").mkdir()
    check_export_out(tmp_path / "run", tmp_path / "empty", True)


def test_evaluate_out_refuses_a_run_folders_own_files(tmp_path):
    from gptforge.eval.model_source import check_results_out

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("model: {}\n")
    for bad in (run / "config.yaml", run / "results.json", run / "checkpoints" / "x.json"):
        with pytest.raises(InputError, match="eval/"):
            check_results_out(str(bad))
    for ok in (run / "eval" / "mine.json", tmp_path / "elsewhere.json"):
        check_results_out(str(ok))
    cmd = [sys.executable, "-m", "gptforge.cli", "evaluate", str(run), "--text", str(run / "config.yaml"),
           "--out", str(run / "config.yaml")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "eval/" in done.stderr, done.stderr
    assert (run / "config.yaml").read_text() == "model: {}\n"


def test_a_killed_exports_staging_folder_is_removed_by_the_next(tmp_path):
    """issue 41 item 7: a killed export left `.NAME.tmp-PID/` for good."""
    import os

    from gptforge.atomic import staged_dir

    dead = tmp_path / ".out.tmp-999999999"
    dead.mkdir()
    (dead / "model.safetensors").write_bytes(b"x" * 10)
    live = tmp_path / f".out.tmp-{os.getppid()}"  # a live process's staging folder is left alone
    live.mkdir()
    with staged_dir(tmp_path / "out") as tmp:
        (tmp / "a.txt").write_text("a")
    assert not dead.exists() and live.exists() and (tmp_path / "out" / "a.txt").is_file()
