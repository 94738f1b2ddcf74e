"""Concurrent clients, batched == alone, and a clean SIGTERM shutdown of `gptforge serve`."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx

from tests.serve.conftest import API_KEY

H = {"Authorization": f"Bearer {API_KEY}"}
PROMPTS = ["def main():\n    ", "import os\nimport sys\n", "class A:", "# ", "return", "for i in range(3):\n",
           "x = [", "if __name__ == '__main__':\n    main()\n    print('done')\n"]


def _complete(url, prompt, max_tokens, stream):
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if not stream:
        r = httpx.post(url + "/v1/completions", json=body, headers=H, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]
    text = ""
    with httpx.stream("POST", url + "/v1/completions", json=body, headers=H, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                text += json.loads(line[6:])["choices"][0]["text"]
    return text


def test_eight_clients_three_requests_each_match_greedy_alone(live):
    """8 concurrent clients x 3 requests, mixed streaming; each output equals the request run alone.
    (The trained model's greedy steps are decisive for these prompts: the engine test checks the
    top-2 gaps; here exact text equality is the check.)"""
    jobs = [(PROMPTS[(c + k) % 8], 4 + 3 * ((c * 3 + k) % 5), (c + k) % 2 == 0) for c in range(8) for k in range(3)]
    alone = {(p, n): _complete(live.url, p, n, False) for p, n, _ in jobs}
    baseline = _rss_bytes()  # the server runs in this process (a thread); warmed up by the runs above
    results, errors = {}, []

    def client(c):
        try:
            for k in range(3):
                p, n, stream = jobs[c * 3 + k]
                results[c * 3 + k] = _complete(live.url, p, n, stream)
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len(results) == 24
    mismatched = [i for i, (p, n, _) in enumerate(jobs) if results[i] != alone[(p, n)]]
    assert len(mismatched) <= 1, mismatched  # a rare near-tie may flip one token under batching
    engine = live.app.state.server.engine
    assert engine.num_running == 0 and len(engine.free_slots) == engine.max_batch_size
    if baseline:
        assert _rss_bytes() <= 1.10 * baseline, (baseline, _rss_bytes())  # memory back to its baseline


def _rss_bytes() -> int:
    """Resident set size of this process (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def test_sigterm_shuts_the_server_down_cleanly(trained_run, tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "gptforge.cli", "serve", str(trained_run), "--port", str(port),
                             "--served-model-name", "tiny", "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() else "timeout"
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        models = httpx.get(url + "/v1/models", timeout=10).json()
        assert models["data"][0]["id"] == "tiny"
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("text", _complete_plain(url)))
        t.start()
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        t.join(30)
        _stdout, stderr = proc.communicate(timeout=30)
        # uvicorn finishes in-flight requests, then re-raises the signal: the exit status says SIGTERM.
        assert proc.returncode in (0, -signal.SIGTERM), stderr
        assert "Traceback" not in stderr and "Error" not in stderr, stderr
        assert out.get("text") == 200  # the in-flight request was answered before the process ended
    finally:
        if proc.poll() is None:
            proc.kill()


def _complete_plain(url):
    r = httpx.post(url + "/v1/completions", json={"prompt": "def f():", "max_tokens": 50, "temperature": 0},
                   timeout=30)
    return r.status_code
