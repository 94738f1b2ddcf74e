"""FolderLock: one writer per folder, the holder named, stale locks taken over (issue 15 item 2)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from gptforge.runtime.lock import FolderLock, FolderLockedError, lock_path_for

HOLD = """
import sys, time
from gptforge.runtime.lock import FolderLock
lock = FolderLock(sys.argv[1], command="holder-test").acquire()
print("held", flush=True)
time.sleep(60)
"""


def _holder(folder):
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_second_writer_is_refused_naming_the_holder(tmp_path):
    folder = tmp_path / "run"
    p = _holder(folder)
    try:
        with pytest.raises(FolderLockedError) as e:
            FolderLock(folder).acquire()
        assert f"pid {p.pid}" in str(e.value) and "holder-test" in str(e.value)
    finally:
        p.kill()
        p.wait()


def test_lock_of_a_killed_holder_is_stale_and_taken_over(tmp_path, caplog):
    folder = tmp_path / "run"
    p = _holder(folder)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert lock_path_for(folder).exists()  # kill -9 leaves the file...
    with caplog.at_level("WARNING", logger="gptforge"):
        with FolderLock(folder, command="second") as lock:  # ... but not the lock
            assert lock.took_over["pid"] == p.pid
            assert json.loads(lock_path_for(folder).read_text())["pid"] == os.getpid()
    assert "stale lock" in caplog.text and str(p.pid) in caplog.text
    assert not lock_path_for(folder).exists()


def test_released_on_exit_and_refused_twice_in_one_process(tmp_path):
    folder = tmp_path / "out"
    with FolderLock(folder):
        with pytest.raises(FolderLockedError):
            FolderLock(folder).acquire()
    with FolderLock(folder) as again:
        assert again.held and again.took_over is None
    # a normal exit of a holder process releases it too
    code = "import sys; from gptforge.runtime.lock import FolderLock; FolderLock(sys.argv[1]).acquire()"
    subprocess.run([sys.executable, "-c", code, str(folder)], check=True)
    t = time.time()
    with FolderLock(folder) as lock:
        assert lock.took_over is None and time.time() - t < 5
