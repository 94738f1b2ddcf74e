"""A stop (SIGTERM) while the engine process hangs ends at once: its requests get an error, the
silent child is killed without waiting, and no task is left for uvicorn to cancel (issue 41 item 8:
it took 33 s and printed a CancelledError)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time

import httpx


def test_sigterm_while_the_engine_process_hangs_stops_at_once(trained, tokenizer_file, monkeypatch, caplog):
    import uvicorn

    from gptforge.infer import engine_process
    from gptforge.serve.app import ServeConfig, create_app
    from gptforge.serve.listen import draining_server

    monkeypatch.setattr(engine_process, "STALL_S", 2.0)
    model, _tok = trained
    app = create_app(model, tokenizer_file, ServeConfig(model_name="tiny", max_batch_size=2, engine_process=True))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = draining_server(app, uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=10))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    engine = app.state.server.engine
    try:
        deadline = time.time() + 60
        while not server.started:
            assert time.time() < deadline and thread.is_alive(), "server did not start"
            time.sleep(0.02)
        pid = engine._proc.pid
        answers: dict = {}
        body = {"model": "tiny", "prompt": "def f(x):", "max_tokens": 40, "temperature": 0}
        engine.pause()  # the request waits in the child, which then hangs
        t = threading.Thread(target=lambda: answers.setdefault(
            "r", httpx.post(url + "/v1/completions", json=body, timeout=60)))
        t.start()
        while engine.num_waiting == 0:
            assert time.time() < deadline
            time.sleep(0.01)
        os.kill(pid, signal.SIGSTOP)
        while engine.alive:  # silent past STALL_S
            assert time.time() < deadline, "a stopped child still counts as alive"
            time.sleep(0.05)
        with caplog.at_level(logging.INFO):
            t0 = time.monotonic()
            server.handle_exit(signal.SIGTERM, None)  # what uvicorn's SIGTERM handler calls
            thread.join(30)
            took = time.monotonic() - t0
        t.join(10)
        assert not thread.is_alive() and took < 4.0, f"the stop took {took:.1f} s"
        r = answers["r"]
        assert r.status_code == 500 and "has not answered" in r.json()["error"]["message"], r.text
        assert "the server is stopping" in r.json()["error"]["message"]
        logged = "\n".join(rec.getMessage() + str(rec.exc_info) for rec in caplog.records)
        assert "Cancel" not in logged and "CancelledError" not in logged, logged
        assert engine._proc is None  # the child was killed and reaped
        deadline = time.time() + 10
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            assert time.time() < deadline, "the hung child is still there"
            time.sleep(0.05)
    finally:
        server.should_exit = True
        thread.join(15)
        try:
            os.kill(engine._proc.pid, signal.SIGKILL) if engine._proc is not None else None
        except ProcessLookupError:
            pass
        sock.close()
