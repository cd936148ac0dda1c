"""A worker's channel to the parameter server: the handshake, shared memory, and one request's
frames out and its reply's in, sealed, checked and decoded.

:class:`~pipeline.train.ps.client.Client` says what to ask (pull, push, a task's progress);
a channel moves it: float32 payloads on the socket (or bfloat16 or float16 there, half the
bytes), or through the server's shared file on its machine.
"""

from __future__ import annotations

import dataclasses
import hmac
import os
import socket
from typing import Any

import numpy as np

from pipeline.errors import ConfigError
from pipeline.train.ps import protocol as p
from pipeline.train.ps import wire
from pipeline.train.ps.shm import SharedBuffers


@dataclasses.dataclass(frozen=True)
class Sent:
    """A request on its way: what its reply is checked and decoded by."""

    seq: int
    weights: bool  # the weights come back on the socket
    narrow: int  # in this wire type (0: float32)
    most: int  # bytes at most, where not the weights


#: What seals a connection's frames (bench/ps.py swaps in the HMAC protocol it compares with).
SESSION = p.Session


class Channel:
    """One authenticated connection to the server, for one worker.

    Args:
        address: the server's ``(host, port)``.
        secret: the per-run secret.
        worker: the worker's id, in every request's header.
        size: number of weights.
        timeout_s: socket timeout.
        shared_memory: move payloads through shared memory when the server offers it, this
            process can map it, and the connection's two ends have one address.
        wire_dtype: the payloads' type on the socket (:mod:`pipeline.train.ps.wire`).

    The arrays that :meth:`center` returns are the receive buffer: valid until the next
    request.
    """

    def __init__(
        self,
        address: tuple[str, int],
        *,
        secret: bytes,
        worker: int,
        size: int,
        timeout_s: float,
        shared_memory: bool,
        wire_dtype: str,
    ) -> None:
        if wire_dtype not in wire.FLAGS:
            raise ConfigError(
                f"Expected a wire dtype in {', '.join(wire.NAMES)}. Received: {wire_dtype!r}"
            )
        self.address, self.worker, self.size = address, worker, size
        self._narrow = wire.FLAGS[wire_dtype]
        self._wire = np.empty(size if self._narrow else 0, np.uint16)
        self._buf = np.empty(size, np.float32)
        self._seq = 0
        self._sock = socket.create_connection(self.address, timeout=timeout_s)
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._session = self._handshake(secret)
            self._shared: SharedBuffers | None = None
            # Shared memory only between the two ends of one host: a worker whose address
            # differs from the server's is on another machine (or another network
            # namespace, which the tests use as one), and stays on TCP.
            here, there = self._sock.getsockname()[0], self._sock.getpeername()[0]
            self._shared = self._attach() if shared_memory and here == there else None
        except BaseException:
            self._sock.close()
            raise

    def _handshake(self, secret: bytes) -> p.Session:
        """Prove the secret, and make the server prove it too."""
        theirs = bytearray(p.NONCE_BYTES)
        p.recv_exact(self._sock, memoryview(theirs))
        ours = os.urandom(p.NONCE_BYTES)
        self._sock.sendall(ours + p.client_proof(secret, bytes(theirs), ours))
        answer = bytearray(1 + p.PROOF_BYTES)
        p.recv_exact(self._sock, memoryview(answer))
        if answer[0] != p.OK:
            raise p.ProtocolError(
                "the parameter server refused this worker's proof of the run's secret (auth)"
            )
        if not hmac.compare_digest(bytes(answer[1:]), p.server_proof(secret, bytes(theirs), ours)):
            raise p.ProtocolError(
                f"the parameter server at {self.address[0]}:{self.address[1]} did not prove the "
                "run's secret: not this run's server"
            )
        return SESSION.client(p.Keys.derive(secret, bytes(theirs), ours), self.size * 4)

    @property
    def shared(self) -> bool:
        """Whether payloads travel through shared memory rather than the socket."""
        return self._shared is not None

    def _attach(self) -> SharedBuffers | None:
        """Ask for the server's shared file, map it, and prove it with the cookie in it."""
        _, token = self.request(p.ATTACH, most=p.MAX_TOKEN)
        if not token:
            return None  # not offered
        shared = None
        try:
            shared = SharedBuffers.open(bytes(token).decode("ascii", "replace"), self.size)
            cookie = shared.cookie
        except (OSError, p.ProtocolError):
            cookie = bytes(p.COOKIE_BYTES)  # another machine: the server will withdraw the offer
        reply, _ = self.request(p.ATTACH, body=cookie)
        if shared is not None and reply.flags != 1:
            shared.close()
            shared = None
        return shared

    def request(
        self, op: int, payload: np.ndarray | None = None, **options: Any
    ) -> tuple[p.Header, memoryview]:
        """Send a request (:meth:`send`'s ``options``); return the reply's header and payload
        (at most ``most`` bytes; the weights' size where the weights come back on the socket),
        both authenticated."""
        return self.receive(self.send(op, payload, **options))

    def send(
        self,
        op: int,
        payload: np.ndarray | None = None,
        *,
        clock: int = 0,
        body: bytes = b"",
        most: int = 0,
        task: int = 0,
        exchange: int = 0,
        steps: int = 0,
    ) -> Sent:
        """Send a request without waiting for its reply (:meth:`receive` takes it; one
        request at a time is in flight on a channel)."""
        self._seq += 1
        shared = self._shared is not None and op not in (p.STATS, p.ATTACH, p.PROGRESS)
        weights = op in (p.PULL, p.PEEK, p.PUSH_PULL) and not shared
        narrow = self._narrow if not shared and op in (p.PULL, p.PEEK, p.PUSH, p.PUSH_PULL) else 0
        out: memoryview | bytes = body
        if payload is not None:
            if payload.dtype != np.float32 or payload.size != self.size:
                raise ConfigError(
                    f"Expected {self.size} float32 values. Received: {payload.size} {payload.dtype}"
                )
            if shared:
                assert self._shared is not None
                np.copyto(self._shared.request, payload)
                out = b""
            elif narrow:
                out = wire.encode(np.ascontiguousarray(payload), narrow, self._wire)
                if wire.overflowed(payload, self._wire, narrow):
                    raise p.ProtocolError(
                        "a delta went past float16's range (+-65504) on the wire: use --wire-dtype "
                        "bfloat16, which keeps float32's",
                        reason="range",
                    )
            else:
                out = np.ascontiguousarray(payload).data.cast("B")
        header, sealed = self._session.seal(
            p.Header(
                op,
                self.worker,
                self._seq,
                clock,
                len(out),
                flags=p.SHARED if shared else narrow,
                task=task,
                exchange=exchange,
                steps=steps,
            ),
            out,
        )
        if len(sealed) > 4096:
            self._sock.sendall(header)
            self._sock.sendall(sealed)
        else:
            self._sock.sendall(header + bytes(sealed))
        return Sent(self._seq, weights, narrow, most)

    def receive(self, sent: Sent) -> tuple[p.Header, memoryview]:
        """The reply to the request ``sent``: its header and payload, authenticated."""
        weights, narrow, most = sent.weights, sent.narrow, sent.most
        raw = bytearray(p.HEADER.size)
        p.recv_exact(self._sock, memoryview(raw))
        reply = p.unpack(raw)
        if reply.op != p.OK:
            reason = p.STATUS.get(reply.op, str(reply.op))
            raise p.ProtocolError(
                f"the parameter server refused the request ({reason})", reason=reason
            )
        allowed = self.size * wire.itemsize(narrow) if weights else most
        if reply.seq != sent.seq or (
            reply.length != allowed if weights else reply.length > allowed
        ):
            raise p.ProtocolError(
                f"the parameter server's reply does not fit the request (sequence {reply.seq}, "
                f"{reply.length} bytes)"
            )
        into = (
            (self._wire if narrow else self._buf).data.cast("B")
            if weights
            else memoryview(bytearray(reply.length))
        )
        if len(into):
            p.recv_exact(self._sock, self._session.inlet(reply.length, into))
        if not self._session.open(reply, into):
            raise p.ProtocolError(
                "a reply from the parameter server failed authentication (altered in transit?)"
            )
        if weights and narrow:
            wire.decode(into, narrow, self._buf)
            if (
                narrow == wire.FLAGS["float16"] and not np.isfinite(self._buf).all()
            ):  # the center is finite
                raise p.ProtocolError(
                    "the center has weights past float16's range (+-65504) on the wire: use "
                    "--wire-dtype bfloat16, which keeps float32's",
                    reason="range",
                )
        return reply, into

    def center(self) -> np.ndarray:
        """The center a PULL, PUSH_PULL or PEEK answered: in the shared file, or the receive
        buffer."""
        return self._shared.response if self._shared is not None else self._buf

    def close(self) -> None:
        self._sock.close()
        if self._shared is not None:
            self._shared.close()
