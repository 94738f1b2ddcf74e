"""The engine in its own process (gptforge.infer.engine_process): the in-process engine's answers,
pause / cancel / stop, a child that dies, and the HTTP server over it."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import httpx
import pytest

from gptforge.infer.engine import Engine, SamplingParams
from gptforge.infer.engine_process import EngineProcess
from tests.serve.conftest import LiveServer

JOBS = [([5, 6, 7, 8, 9], 12), ([40, 41], 7), ([100, 3, 3, 3, 3, 3, 3, 3, 3], 10)]


class Collector:
    """Events per job, and a flag set when every job has finished."""

    def __init__(self, n: int):
        self.events: list[list] = [[] for _ in range(n)]
        self.left = n
        self.done = threading.Event()

    def sink(self, j: int):
        def on_event(ev):
            self.events[j].append(ev)
            if ev.finish_reason:
                self.left -= 1
                if not self.left:
                    self.done.set()
        return on_event

    def wait(self, timeout: float = 60):
        assert self.done.wait(timeout), f"{self.left} job(s) did not finish: {self.events}"


def _tokens(events):
    return [e.token_id for e in events if e.token_id is not None]


@pytest.fixture(scope="module")
def proc_engine(trained, tokenizer_file):
    model, _tok = trained
    eng = EngineProcess(model, tokenizer_file, max_batch_size=2, max_model_len=64)
    eng.start()
    yield eng
    eng.stop()


def test_the_engine_process_answers_as_the_engine_in_process(trained, proc_engine):
    model, tok = trained
    params = [SamplingParams(max_tokens=n, temperature=0, logprobs=2) for _, n in JOBS]
    local = Engine(model, tok.decode, max_batch_size=2, max_model_len=64)
    want = Collector(len(JOBS))
    for j, ((prompt, _), p) in enumerate(zip(JOBS, params, strict=True)):
        local.submit(prompt, p, want.sink(j))
    while local.step():
        pass
    got = Collector(len(JOBS))
    for j, ((prompt, _), p) in enumerate(zip(JOBS, params, strict=True)):
        proc_engine.submit(prompt, p, got.sink(j))
    got.wait()
    for j, (_, n) in enumerate(JOBS):
        assert _tokens(got.events[j]) == _tokens(want.events[j]) and len(_tokens(got.events[j])) == n
        assert "".join(e.text for e in got.events[j]) == "".join(e.text for e in want.events[j])
        assert got.events[j][-1].finish_reason == "length"
        assert got.events[j][0].logprob.logprob == pytest.approx(want.events[j][0].logprob.logprob, abs=1e-4)
    assert proc_engine.stats.decode_passes > 0 and proc_engine.stats.prefill_sequences >= len(JOBS)
    assert proc_engine.child_cpu_seconds > 0
    assert proc_engine.num_running == 0 and proc_engine.num_waiting == 0 and proc_engine.num_free_slots == 2
    with pytest.raises(ValueError, match="more than the model's context of 64"):
        proc_engine.submit([1] * 60, SamplingParams(max_tokens=10), lambda ev: None)


def test_paused_requests_wait_a_cancelled_one_gets_nothing_and_the_rest_finish(proc_engine):
    got = Collector(3)
    proc_engine.pause()
    try:
        reqs = [proc_engine.submit([7, 8, 9], SamplingParams(max_tokens=6, temperature=0), got.sink(j)) for j in range(3)]
        time.sleep(0.2)  # a running child would have answered by now
        assert proc_engine.num_waiting == 3 and all(e == [] for e in got.events)
        proc_engine.cancel(reqs[1])
        got.left -= 1
        assert proc_engine.num_waiting == 2
    finally:
        proc_engine.resume()
    got.wait()
    assert got.events[1] == []
    assert len(_tokens(got.events[0])) == 6 and _tokens(got.events[0]) == _tokens(got.events[2])


def test_stop_cancels_what_runs_and_a_stopped_engine_refuses_work(trained, tokenizer_file):
    model, _tok = trained
    eng = EngineProcess(model, tokenizer_file, max_batch_size=1, max_model_len=64)
    eng.start()
    got = Collector(2)
    eng.pause()
    eng.submit([1, 2, 3], SamplingParams(max_tokens=50), got.sink(0))
    eng.submit([4, 5, 6], SamplingParams(max_tokens=50), got.sink(1))
    eng.stop()
    got.wait(5)
    assert [ev[-1].finish_reason for ev in got.events] == ["cancelled", "cancelled"]
    assert not eng.alive
    with pytest.raises(RuntimeError, match="not running"):
        eng.submit([1, 2], SamplingParams(max_tokens=2), lambda ev: None)


def _post(srv, body, path="/v1/completions"):
    return httpx.post(srv.url + path, json=dict(body, model="tiny"), timeout=60)


def test_the_server_over_an_engine_process_and_a_child_that_dies(trained, tokenizer_file, live):
    """A killed child fails its request, is replaced once (engine_restarts=1), and the second
    death leaves the server down."""
    from gptforge.serve.app import ServeConfig, create_app

    model, _tok = trained
    cfg = ServeConfig(model_name="tiny", max_batch_size=2, engine_process=True, engine_restarts=1)
    body = {"prompt": "def f(x):", "max_tokens": 8, "temperature": 0}
    with LiveServer(create_app(model, tokenizer_file, cfg)) as srv:
        engine = srv.app.state.server.engine
        assert isinstance(engine, EngineProcess) and engine.alive
        assert httpx.get(srv.url + "/health", timeout=30).status_code == 200
        assert "gptforge_engine_up 1.0" in httpx.get(srv.url + "/metrics", timeout=30).text
        assert subprocess.run(["pgrep", "-P", str(os.getpid()), "gptforge-engine"], capture_output=True,
                              text=True).stdout.split().count(str(engine._proc.pid)) == 1
        r = _post(srv, body)
        assert r.status_code == 200, r.text
        # the same text as the in-process server of the other tests
        reference = httpx.post(live.url + "/v1/completions", json=dict(body, model="tiny"),
                               headers={"Authorization": "Bearer test-key"}, timeout=60)
        assert r.json()["choices"][0]["text"] == reference.json()["choices"][0]["text"]
        with httpx.stream("POST", srv.url + "/v1/completions", json=dict(body, model="tiny", stream=True),
                          timeout=60) as s:
            text = "".join(line for line in s.iter_lines())
        assert text.endswith("data: [DONE]") and '"finish_reason":"length"' in text

        engine.pause()
        result: dict = {}
        t = threading.Thread(target=lambda: result.setdefault("r", _post(srv, body)))
        t.start()
        deadline = time.time() + 30
        while engine.num_waiting == 0:
            assert time.time() < deadline
            time.sleep(0.01)
        first_pid = engine._proc.pid  # read before the kill: the replacement may start before t ends
        os.kill(first_pid, signal.SIGKILL)
        t.join(30)
        assert result["r"].status_code == 500 and "engine process exited" in result["r"].json()["error"]["message"]
        deadline = time.time() + 60
        while httpx.get(srv.url + "/health", timeout=30).status_code != 200:  # the new child is starting
            assert time.time() < deadline, f"no new engine process: {engine.down_reason()}"
            time.sleep(0.05)
        assert engine.restarts == 1 and engine._proc.pid != first_pid
        assert "gptforge_engine_restarts 1.0" in httpx.get(srv.url + "/metrics", timeout=30).text
        again = _post(srv, body)
        assert again.status_code == 200 and again.json()["choices"][0]["text"] == r.json()["choices"][0]["text"]
        os.kill(engine._proc.pid, signal.SIGKILL)  # out of restarts: the server stays down
        deadline = time.time() + 30
        while "restart the server" not in (engine.down_reason() or ""):  # the reader thread's last word
            assert time.time() < deadline
            time.sleep(0.01)
        why = ("the engine is not running: the engine process exited with code -9; it died 2 times in 600 s and is "
               "not restarted again: restart the server")
        health = httpx.get(srv.url + "/health", timeout=30)
        assert health.status_code == 503 and health.json()["error"]["message"] == why
        assert "gptforge_engine_up 0.0" in httpx.get(srv.url + "/metrics", timeout=30).text
        r = _post(srv, body)
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_down"
        assert r.json()["error"]["message"] == why


def test_a_stopped_child_is_not_alive_and_an_idle_one_stays_alive(trained, tokenizer_file, monkeypatch):
    from gptforge.infer import engine_process

    monkeypatch.setattr(engine_process, "STALL_S", 3.0)
    model, _tok = trained
    eng = EngineProcess(model, tokenizer_file, max_batch_size=1, max_model_len=64)
    eng.start()
    try:
        time.sleep(4.5)  # idle past STALL_S: the child's heartbeats keep it alive
        assert eng.alive
        os.kill(eng._proc.pid, signal.SIGSTOP)
        deadline = time.time() + 15
        while eng.alive:
            assert time.time() < deadline, "a stopped child still counts as alive"
            time.sleep(0.1)
        assert "has not answered for" in eng.down_reason()
        with pytest.raises(RuntimeError, match="has not answered"):
            eng.submit([1, 2], SamplingParams(max_tokens=2), lambda ev: None)
        os.kill(eng._proc.pid, signal.SIGCONT)
        while not eng.alive:
            assert time.time() < deadline + 10, "the resumed child did not answer again"
            time.sleep(0.1)
        got = Collector(1)
        eng.submit([1, 2], SamplingParams(max_tokens=2, temperature=0), got.sink(0))
        got.wait()
    finally:
        eng.stop()
