"""`gptforge serve` on a port another server holds: one `gptforge serve: error:` line naming the port."""

from __future__ import annotations

import socket

import pytest

from gptforge.errors import InputError
from gptforge.serve.listen import bind_listening_socket


@pytest.fixture
def busy_port():
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    yield holder.getsockname()[1]
    holder.close()


def test_serve_on_a_busy_port_is_one_error_line(trained_run, busy_port, capsys):
    from gptforge.cli import main

    assert main(["serve", str(trained_run), "--port", str(busy_port), "--device", "cpu"]) == 1
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1, captured.err
    assert err[0].startswith(f"gptforge serve: error: port {busy_port} on 127.0.0.1 is already in use")
    assert f"--port {busy_port + 1}" in err[0]
    assert "serving" not in captured.out  # refused before announcing anything


def test_bind_listening_socket_binds_a_free_port_and_names_bad_hosts(busy_port):
    with pytest.raises(InputError, match=f"port {busy_port} on 127.0.0.1 is already in use"):
        bind_listening_socket("127.0.0.1", busy_port)
    sock = bind_listening_socket("127.0.0.1", 0)
    try:
        client = socket.create_connection(sock.getsockname(), timeout=5)  # it listens
        client.close()
    finally:
        sock.close()
    with pytest.raises(InputError, match="--host no-such-host.invalid: cannot be resolved"):
        bind_listening_socket("no-such-host.invalid", 8000)
