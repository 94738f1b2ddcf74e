"""Curation through the whole `prepare` pipeline on real corpora: openshakespeare's duplicates,
and resume after the process is killed with SIGKILL (no cleanup code runs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gptforge.data.phases.work import WorkFolder
from gptforge.data.prepare import PrepareConfig, prepare
from gptforge.data.stdlib_corpus import stdlib_files

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO / ".." / "shared" / "data"


@pytest.mark.skipif(not (SHARED / "openshakespeare").is_dir(), reason="shared/data/openshakespeare absent")
def test_prepare_openshakespeare_drops_byte_copies_keeps_editions(tmp_path, small_tokenizer):
    root = (SHARED / "openshakespeare").resolve()
    # Milton (with its byte-identical copies) and three plays in both editions: the whole
    # corpus would only make the test slower.
    plays = [root / "shakespeare" / f"{p}{e}.txt" for p in ("lear_gut", "richard_ii_gut", "henry_viii_gut")
             for e in ("", "_f")]
    plays = [p for p in plays if p.exists()]
    inputs = sorted((root / "milton").glob("*.txt")) + plays
    tok = tmp_path / "tok.json"
    small_tokenizer.save(tok)
    out = tmp_path / "out"
    r = prepare(PrepareConfig(inputs=[str(p) for p in inputs], out=str(out), tokenizer=str(tok), workers=1,
                              keep_work=True, shard_bytes=1_000_000), show_progress=False)
    work = tmp_path / ".out.work"
    dropped, kept = set(), set()
    for i in range(len(list((work / "curate").glob("*.arrow")))):
        mask = np.load(work / "dedup" / f"{i:05d}.npy")
        for pos, d in WorkFolder(work).documents(i, None, ("id",)):
            (dropped if mask[pos] else kept).add(Path(d["id"].split(":")[0]).name)
    files = inputs
    by_bytes: dict[bytes, list[str]] = {}
    for p in files:
        by_bytes.setdefault(p.read_bytes(), []).append(p.name)
    copies = [names for names in by_bytes.values() if len(names) > 1]
    assert copies, "the corpus should hold byte-identical Milton copies"
    for names in copies:
        assert sum(n in kept for n in names) == 1 and sum(n in dropped for n in names) == len(names) - 1, names
    shakespeare = {p.name for p in files if p.parent.name == "shakespeare"}
    assert shakespeare <= kept  # modern and First Folio editions are different documents
    assert {"lear_gut.txt", "lear_gut_f.txt"} <= kept
    dedup = next(s for s in r.report["steps"] if s["name"] == "dedup")
    assert dedup["dropped"].get("exact_duplicate", 0) == sum(len(n) - 1 for n in copies)
    assert r.report["check"]["adds_up"]


def _cli(corpus: Path, out: Path, tok: Path) -> list[str]:
    return [sys.executable, "-m", "gptforge.cli", "prepare", str(corpus), "--out", str(out), "--tokenizer", str(tok),
            "--workers", "1", "--shard-bytes", "20000", "--no-progress"]


def test_resume_after_sigkill_is_byte_identical(tmp_path, small_tokenizer):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    size = 0
    for i, f in enumerate(stdlib_files()):
        text = f.read_bytes()
        (corpus / f"{i:04d}.txt").write_bytes(text)
        size += len(text)
        if size > 1_200_000:
            break
    tok = tmp_path / "tok.json"
    small_tokenizer.save(tok)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    ref = tmp_path / "ref"
    subprocess.run(_cli(corpus, ref, tok), check=True, env=env, cwd=REPO, capture_output=True)

    out = tmp_path / "out"
    work = tmp_path / ".out.work"
    proc = subprocess.Popen(_cli(corpus, out, tok), env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    done_before_kill = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        done_before_kill = len(list((work / "curate").glob("*.json"))) if (work / "curate").is_dir() else 0
        if done_before_kill >= 3:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "prepare finished before it could be killed; enlarge the corpus"
    assert not out.exists() and work.is_dir()
    n_shards_done = len(list((work / "curate").glob("*.json")))
    assert n_shards_done >= 3

    again = subprocess.run(_cli(corpus, out, tok), check=True, env=env, cwd=REPO, capture_output=True, text=True)
    assert not work.exists()
    names = sorted(p.name for p in ref.iterdir() if p.suffix in (".bin", ".json") and p.name != "report.json")
    assert names == sorted(p.name for p in out.iterdir() if p.suffix in (".bin", ".json") and p.name != "report.json")
    for n in names:
        assert (out / n).read_bytes() == (ref / n).read_bytes(), n
    import json

    assert json.loads((out / "report.json").read_text())["resumed"] is True
    assert again.returncode == 0
