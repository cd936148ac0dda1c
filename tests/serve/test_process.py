"""The serving port's check (issue 29): it agrees with the server on which ports are free."""

from __future__ import annotations

import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipeline.errors import ConfigError
from pipeline.serve.process import check_serving


def _time_wait_port() -> int:
    """A port nothing listens on, whose last connection sits in TIME_WAIT (the server's side
    closed first, as a model server does after a stop)."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = int(listener.getsockname()[1])
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        accepted.close()  # the server's side closes first: it keeps the port in TIME_WAIT
        client.recv(1)
        client.close()
    return port


def test_a_port_in_time_wait_after_a_stop_can_serve_again() -> None:
    """Proves: 15 s after a stop the port is refused no more ('Address already in use'): the
    check binds as the server does."""
    port = _time_wait_port()
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))  # the TIME_WAIT is there: a bind without SO_REUSEADDR fails
    check_serving(port, 1.0, host="127.0.0.1")
    ThreadingHTTPServer(("127.0.0.1", port), BaseHTTPRequestHandler).server_close()  # as the model server binds


def test_a_port_someone_listens_on_is_refused_in_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        with pytest.raises(ConfigError, match=f"Cannot serve predictions on 127.0.0.1:{port}"):
            check_serving(port, 1.0, host="127.0.0.1")
