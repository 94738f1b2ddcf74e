"""Outside OpenAI-compatible servers the tests start as subprocesses (vLLM, gptforge serve inside a
container): a free loopback port, a wait for the server to answer, the server's log on failure, and
the greedy-ids comparison with gptforge's tie rule."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator, Sequence

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 40) -> str:
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return "\n".join(lines[-n:])


@contextlib.contextmanager
def running_server(cmd: Sequence[str], url: str, log: Path, timeout_s: float, env: dict | None = None,
                   ready_path: str = "/v1/models") -> Iterator[subprocess.Popen]:
    """Start `cmd` (its output to `log`), wait until GET `url + ready_path` answers 200, yield the
    process; on exit stop its process group (SIGINT, then SIGKILL after 30 s).

    Raises:
        AssertionError: the process exited, or did not answer within `timeout_s` seconds; the
            message carries the command and the last lines of its log.
    """
    with open(log, "wb") as out:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"{cmd[0]} exited with {proc.returncode} before answering:\n{_tail(log)}")
            try:
                with urllib.request.urlopen(url + ready_path, timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{' '.join(cmd)} did not answer {url}{ready_path} in {timeout_s:.0f} s:\n"
                                     f"{_tail(log)}")
            time.sleep(2)
        yield proc
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def top2_gap(model, ids: Sequence[int]) -> float:
    """gptforge's top-1 minus top-2 logit after the sequence `ids` (fp32 forward)."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([list(ids)]))[0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1])


def assert_same_greedy(model, prompt: Sequence[int], ours: Sequence[int], theirs: Sequence[int],
                       tie: float = 1e-4) -> None:
    """`theirs` equals `ours` (greedy continuations of `prompt`), or they agree up to a first
    difference where gptforge's top-2 logits lie within `tie` of each other (a near-tie, which
    float rounding may decide either way)."""
    if list(theirs) == list(ours):
        return
    k = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))
    if k == min(len(ours), len(theirs)):
        raise AssertionError(f"lengths differ after {k} equal tokens: {list(ours)} vs {list(theirs)}")
    gap = top2_gap(model, list(prompt) + list(ours[:k]))
    assert gap < tie, (f"first difference at token {k} ({ours[k]} vs {theirs[k]}) where gptforge's top-2 logit "
                       f"gap is {gap:.2e} (>= {tie}): ours {list(ours)}, theirs {list(theirs)}")
