"""prepare reruns safely: a rerun with other options does not reuse the work folder, leftovers of a
killed or failed run are cleaned, a second prepare on one output is refused, and workers die with
their killed parent."""

from __future__ import annotations

import shutil

import pytest

from gptforge.data.phases.work import WorkFolder
from gptforge.data.prepare import PrepareConfig, prepare
from gptforge.data.shards import load_meta, load_tokenizer


@pytest.fixture(scope="module")
def txt_corpus(tmp_path_factory, stdlib_texts):
    root = tmp_path_factory.mktemp("corpus")
    for i, text in enumerate(stdlib_texts[:12]):
        (root / f"doc{i:02d}.txt").write_text(text, encoding="utf-8")
    return root


def _cfg(corpus, out, **kw):
    base = dict(inputs=[str(corpus)], out=str(out), vocab_size=400, val_fraction=0.1, workers=1, recipe="none")
    base.update(kw)
    return PrepareConfig(**base)


def test_rerun_with_another_vocab_size_does_not_reuse_the_work_folder(txt_corpus, tmp_path, caplog):
    out = tmp_path / "data"
    prepare(_cfg(txt_corpus, out, vocab_size=400, keep_work=True), show_progress=False)
    assert WorkFolder.for_output(out).root.is_dir()
    shutil.rmtree(out)  # as if killed after the tokenizer was cached in the work folder
    with caplog.at_level("WARNING", logger="gptforge.data"):
        prepare(_cfg(txt_corpus, out, vocab_size=300), show_progress=False)
    meta = load_meta(out)
    assert meta["prepare_config"]["vocab_size"] == 300
    assert load_tokenizer(out).vocab_size == meta["vocab_size"] <= 300
    assert "vocab_size" in caplog.text and "starting over" in caplog.text


@pytest.mark.parametrize("change", [{"min_frequency": 5}, {"seed": 7}, {"val_fraction": 0.3},
                                    {"tokenizer_train_bytes": 20_000}])
def test_every_output_option_is_in_the_fingerprint(txt_corpus, tmp_path, change):
    from gptforge.data.prepare import work_fingerprint

    a = work_fingerprint(_cfg(txt_corpus, tmp_path / "o"), [txt_corpus], {})
    b = work_fingerprint(_cfg(txt_corpus, tmp_path / "o", **change), [txt_corpus], {})
    assert a != b
    # ... but not workers, which never changes the output
    c = work_fingerprint(_cfg(txt_corpus, tmp_path / "o", workers=3), [txt_corpus], {})
    assert a == c


def test_rerun_after_kill_between_rename_and_cleanup_is_done(txt_corpus, tmp_path, capsys):
    from gptforge.cli import main as _cli

    def prepare_main(argv):
        return _cli(["prepare", *argv])


    out = tmp_path / "data"
    first = prepare(_cfg(txt_corpus, out, keep_work=True), show_progress=False)
    assert WorkFolder.for_output(out).root.is_dir()  # the state a kill after the rename leaves
    bins = {p.name: p.read_bytes() for p in out.glob("*.bin")}
    argv = [str(txt_corpus), "--out", str(out), "--vocab-size", "400", "--val-fraction", "0.1", "--workers", "1",
            "--recipe", "none", "--no-progress"]
    assert prepare_main(argv) == 0
    assert "already complete" in capsys.readouterr().out
    assert not WorkFolder.for_output(out).root.exists()
    assert {p.name: p.read_bytes() for p in out.glob("*.bin")} == bins
    assert load_meta(out) == first.meta
    # other options: still refused, the output is not silently kept
    with pytest.raises(FileExistsError):
        prepare(_cfg(txt_corpus, out, vocab_size=300), show_progress=False)


def test_failed_prepare_leaves_nothing_behind(tmp_path):
    from gptforge.data.prepare import EmptyCorpusError

    src = tmp_path / "src"
    src.mkdir()
    (src / "blank.txt").write_text("\n\n  \n")
    out = tmp_path / "data"
    with pytest.raises(EmptyCorpusError):
        prepare(_cfg(src, out), show_progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_rerun_removes_a_dead_runs_partial_files(txt_corpus, tmp_path):
    out = tmp_path / "data"
    prepare(_cfg(txt_corpus, out, keep_work=True), show_progress=False)
    shutil.rmtree(out)
    work = WorkFolder.for_output(out).root
    junk = [work / "curate" / ".00000.exact.npy.deadbeef.tmp.npy", work / ".tokenizer.json.1234.tmp"]
    for j in junk:
        j.write_bytes(b"x" * 1000)
    stale_out = tmp_path / ".data.tmp-999-abcdef12"
    stale_out.mkdir()
    (stale_out / "train_000.bin").write_bytes(b"\0" * 100)
    prepare(_cfg(txt_corpus, out, keep_work=True), show_progress=False)
    assert not any(j.exists() for j in junk) and not stale_out.exists()
    assert load_meta(out)["splits"]["train"]["tokens"] > 0


def test_second_prepare_on_one_output_is_refused(txt_corpus, tmp_path, capsys):
    from gptforge.runtime.lock import FolderLock, FolderLockedError

    out = tmp_path / "data"
    with FolderLock(out, command="gptforge prepare (first)"):
        with pytest.raises(FolderLockedError, match=r"in use by pid \d+ .*prepare \(first\)"):
            prepare(_cfg(txt_corpus, out), show_progress=False)
        from gptforge.cli import main

        assert main(["prepare", str(txt_corpus), "--out", str(out), "--no-progress"]) == 1
        assert "is in use by pid" in capsys.readouterr().err
    assert not out.exists() and not WorkFolder.for_output(out).root.exists()


POOL_SCRIPT = """
import sys, time
from gptforge.data.phases.pool import WorkerPool
pool = WorkerPool(2, lock_folder=sys.argv[1])
ex = pool.executor()
futs = [ex.submit(time.sleep, 60) for _ in range(2)]
while len(ex._processes) < 2:
    time.sleep(0.05)
time.sleep(1.0)
from multiprocessing import resource_tracker
print(" ".join(str(p) for p in ex._processes), resource_tracker._resource_tracker._pid or "", flush=True)
time.sleep(60)
"""


def _alive(pid):
    import os

    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        return os.path.exists(f"/proc/{pid}")


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads /proc")
def test_workers_die_with_a_killed_parent_and_a_rerun_waits_for_them(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from gptforge.runtime.lock import FolderLock, helpers_path_for

    out = tmp_path / "data"
    p = subprocess.Popen([sys.executable, "-c", POOL_SCRIPT, str(out)], stdout=subprocess.PIPE, text=True)
    pids = [int(x) for x in p.stdout.readline().split()]
    workers, tracker = pids[:2], pids[2:]  # the resource tracker too, where one was started
    assert len(workers) == 2 and all(_alive(w) for w in workers)
    helpers = str(helpers_path_for(out))

    def holds_helpers(pid):
        try:
            return any(os.readlink(f"/proc/{pid}/fd/{fd}") == helpers for fd in os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            return False
    deadline = time.time() + 30  # the workers' initializer has run (spawn start-up is slow on a busy machine)
    while not all(holds_helpers(w) for w in workers) and time.time() < deadline:
        time.sleep(0.05)
    assert all(holds_helpers(w) for w in workers)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    with FolderLock(out, helper_wait=10):  # waits until no worker holds the helpers' lock
        # their files are closed: they are past running any code (the kernel may still be
        # tearing them down, so they need not be zombies yet)
        assert not any(holds_helpers(w) for w in workers)
    deadline = time.time() + 10
    while any(_alive(w) for w in workers + tracker) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_alive(w) for w in workers + tracker)
