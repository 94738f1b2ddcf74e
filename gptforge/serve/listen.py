"""The server's listening socket, bound before uvicorn starts so a busy port is one clear error,
and the uvicorn server that tells the app when it is told to stop."""

from __future__ import annotations

import errno
import socket

from gptforge.errors import InputError


def bind_listening_socket(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A TCP socket bound to (`host`, `port`) and listening, for `uvicorn.Server.run(sockets=[...])`.

    SO_REUSEADDR is set (as uvicorn sets it), so a port left in TIME_WAIT by a server that just
    stopped binds again; a port another process listens on does not.

    Raises:
        InputError: the host does not resolve, the port is taken (naming it and what to do), the
            port needs privileges, or the address is not this machine's.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise InputError(f"--host {host}: cannot be resolved ({e.strerror}); give an address such as 127.0.0.1 "
                         "or 0.0.0.0") from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(backlog)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise InputError(f"port {port} on {host} is already in use (another server is listening there): stop "
                             f"that server, or choose a free port with --port {port + 1 if port < 65535 else 8000}"
                             ) from None
        if e.errno == errno.EACCES:
            raise InputError(f"port {port} on {host}: permission denied (ports below 1024 need root); choose "
                             "--port 1024 or above") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise InputError(f"--host {host}: not an address of this machine; use 127.0.0.1 (this machine only) "
                             "or 0.0.0.0 (every interface)") from None
        raise
    sock.set_inheritable(True)
    return sock


def draining_server(app, config):
    """A `uvicorn.Server` for `app` (built by `gptforge.serve.app.create_app`) that, when told to
    exit (SIGTERM, SIGINT), first sets `app.state.server.stopping`: a request whose engine is dead
    or silent then ends with an error at once (`server.Submission.events`), and a silent engine
    process is killed without waiting for it (`EngineProcess.stop`). Without that a SIGTERM while
    the engine hangs held the drain until uvicorn's graceful timeout, printed the CancelledError of
    the tasks it cancelled, then waited for the engine's stop: 33 s in a trial.

    During the drain uvicorn accepts no new connection (its listening socket is closed at once: a
    load balancer sees the server leave); with a dead engine the drain now ends within a second.
    """
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            app.state.server.stopping = True
            super().handle_exit(sig, frame)

    return DrainingServer(config)
