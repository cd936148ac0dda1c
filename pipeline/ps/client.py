"""A worker's connection to the parameter server."""

from __future__ import annotations

import json
import socket
from types import TracebackType
from typing import Any

import numpy as np

from pipeline.errors import ConfigError
from pipeline.ps import protocol as p


def parse_address(address: str | tuple[str, int]) -> tuple[str, int]:
    """``"host:port"`` or ``(host, port)``.

    >>> parse_address("127.0.0.1:7000")
    ('127.0.0.1', 7000)
    """
    if isinstance(address, tuple):
        return address
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"Expected a parameter-server address HOST:PORT. Received: {address!r}")
    return host, int(port)


class Client:
    """Pull and push flat float32 weights.

    Args:
        address: the server's ``(host, port)`` or ``"host:port"``.
        secret: the per-run secret.
        worker: this worker's id (staleness is tracked per id).
        size: number of weights.
        timeout_s: socket timeout.

    The arrays that :meth:`pull` and :meth:`push_pull` return are this client's
    receive buffer: valid until its next call (copy them to keep them).
    """

    def __init__(
        self, address: str | tuple[str, int], *, secret: bytes, worker: int, size: int, timeout_s: float = 60.0
    ) -> None:
        self.address = parse_address(address)
        self.worker = worker
        self.size = size
        self.clock = 0
        self.last_staleness = 0
        self._buf = np.empty(size, np.float32)
        self._seq = 0
        self._sock = socket.create_connection(self.address, timeout=timeout_s)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        nonce = bytearray(p.NONCE_BYTES)
        p.recv_exact(self._sock, memoryview(nonce))
        self._sock.sendall(p.challenge_answer(secret, bytes(nonce)))
        self._key = p.session_key(secret, bytes(nonce))

    def _request(self, op: int, payload: np.ndarray | None = None) -> p.Header:
        self._seq += 1
        length = 0 if payload is None else payload.nbytes
        header = p.pack(p.Header(op, self.worker, self._seq, self.clock, length), self._key)
        if payload is None:
            self._sock.sendall(header)
        else:
            if payload.dtype != np.float32 or payload.size != self.size:
                raise ConfigError(f"Expected {self.size} float32 values. Received: {payload.size} {payload.dtype}")
            self._sock.sendall(header)
            self._sock.sendall(np.ascontiguousarray(payload).data.cast("B"))
        raw = bytearray(p.HEADER.size)
        p.recv_exact(self._sock, memoryview(raw))
        reply = p.unpack(raw)
        if reply.op != p.OK:
            raise p.ProtocolError(f"the parameter server refused the request ({p.STATUS.get(reply.op, reply.op)})")
        return reply

    def pull(self) -> np.ndarray:
        """The center weights now; remembers the clock for staleness."""
        reply = self._request(p.PULL)
        p.recv_exact(self._sock, self._buf.data.cast("B"))
        self.clock = reply.clock
        return self._buf

    def push(self, delta: np.ndarray) -> int:
        """Send an update; return its staleness (updates applied since this worker pulled)."""
        reply = self._request(p.PUSH, delta)
        self.last_staleness = reply.flags
        return reply.flags

    def push_pull(self, delta: np.ndarray) -> np.ndarray:
        """Send an update and get the new center in one round trip."""
        reply = self._request(p.PUSH_PULL, delta)
        p.recv_exact(self._sock, self._buf.data.cast("B"))
        self.clock = reply.clock
        self.last_staleness = reply.flags
        return self._buf

    def stats(self) -> dict[str, Any]:
        reply = self._request(p.STATS)
        body = bytearray(reply.length)
        p.recv_exact(self._sock, memoryview(body))
        result: dict[str, Any] = json.loads(body)
        return result

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
