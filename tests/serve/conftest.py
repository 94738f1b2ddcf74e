"""A live server on 127.0.0.1 (a free port) over the trained test model, in a thread."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from tests.infer.conftest import byte_tokenizer, trained, trained_run  # noqa: F401  (shared fixtures)

API_KEY = "test-key"


class LiveServer:
    def __init__(self, app):
        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()


@pytest.fixture(scope="session")
def tokenizer_file(trained_run):
    from gptforge.runtime.loading import load_for_inference

    return load_for_inference(trained_run, "cpu")[3]


@pytest.fixture(scope="session")
def live(trained, tokenizer_file):
    """A server named "tiny" with API key `API_KEY`, max_batch_size 8, max_model_len 64."""
    from gptforge.serve.app import ServeConfig, create_app

    model, _tok = trained
    app = create_app(model, tokenizer_file, ServeConfig(model_name="tiny", api_key=API_KEY, max_batch_size=8,
                                                        max_body_bytes=64 * 1024))
    with LiveServer(app) as srv:
        yield srv


@pytest.fixture
def client(live):
    import openai

    c = openai.OpenAI(base_url=live.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    yield c
    c.close()
