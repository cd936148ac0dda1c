"""One authenticated parameter-server connection: its request loop, its frames (payloads over
the socket, or through a shared-memory file) and the checks a pushed buffer passes.

It knows the protocol, not the weights: every well-formed request is handed to the server's
:meth:`~pipeline.train.ps.server.ParameterServer.answer`.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import math
import socket
import time
from typing import TYPE_CHECKING

import numpy as np

from pipeline.train.ps import protocol as p
from pipeline.train.ps import wire
from pipeline.train.ps.shm import SharedBuffers

if TYPE_CHECKING:
    from pipeline.train.ps.transport import Transport

log = logging.getLogger(__name__)


def acceptable(delta: np.ndarray, max_norm: float | None) -> bool:
    """Whether a pushed buffer is finite with a norm in bounds. Its sum of squares in float32
    is NaN for a NaN, Inf for an Inf or for a norm past ~1.8e19 (finite values up to 3e38
    decode fine): one pass, no copy.

    >>> nan = np.array([1, np.nan], np.float32)
    >>> acceptable(np.ones(4, np.float32), None), acceptable(nan, None)
    (True, False)
    >>> acceptable(np.array([3e38], np.float32), None), acceptable(np.full(4, 10, np.float32), 5.0)
    (False, False)
    """
    with np.errstate(over="ignore", invalid="ignore"):
        squares = float(np.dot(delta, delta))
    return math.isfinite(squares) and (max_norm is None or squares <= max_norm * max_norm)


class Connection:
    """One authenticated connection's request loop."""

    def __init__(self, transport: Transport, conn: socket.socket, session: p.Session) -> None:
        self.transport, self.conn, self.session = transport, conn, session
        self.server = transport.server
        size = self.server.size
        # One receive and one send buffer per connection, allocated once: a request's
        # declared length never decides an allocation. Each has room for a tag after the
        # weights, so that they also hold the frames' ciphertext: a request's is received
        # into the outbox (the center is written there only once the request is opened and
        # applied), and the reply is sealed into the inbox (consumed by then).
        self.in_room, self.out_room = (
            np.empty(size + p.TAG_BYTES // 4, np.float32) for _ in range(2)
        )
        self.inbox, self.outbox = self.in_room[:size], self.out_room[:size]
        self.wire: np.ndarray | None = (
            None  # narrowed payloads (bfloat16, float16), once a request asks
        )
        self.shared: SharedBuffers | None = None  # offered to this connection
        self.attached = False  # and mapped by its worker

    def serve(self) -> None:
        try:
            self._loop()
        except TimeoutError:
            raise  # idle: counted by the transport
        except OSError:  # a reply into a connection its worker's death reset
            self.transport.broken()
        finally:
            if self.shared is not None:
                self.shared.close()

    def _loop(self) -> None:
        conn, refuse = self.conn, self.transport.refuse
        nbytes = self.server.size * 4
        raw = bytearray(p.HEADER.size)
        cookie = bytearray(p.COOKIE_BYTES)
        seq = 0
        while not self.transport.stopping:
            try:
                p.recv_exact(conn, memoryview(raw))
            except p.Closed:
                return  # between frames: a worker that is done
            except ConnectionError:
                return self.transport.broken()
            started = time.perf_counter()
            try:
                h = p.unpack(raw)
            except p.ProtocolError:
                return refuse(conn, "frame", p.ERR_FRAME)
            seq += 1
            if h.seq != seq:
                return refuse(conn, "auth", p.ERR_AUTH)
            shared, narrow = h.flags & p.SHARED, h.flags & wire.MASK
            if (
                h.op not in p.OPS
                or h.op == p.ROWS  # a row server's: none here
                or h.flags & ~(p.SHARED | wire.MASK)
                or (shared and not self.attached)
                or (shared and narrow)
                or wire.name_of(narrow) is None
            ):
                return refuse(conn, "frame", p.ERR_FRAME)
            # What the op allows, checked before a byte of payload is read.
            pushes = h.op in (p.PUSH, p.PUSH_PULL)
            if h.op == p.ATTACH:
                if (
                    h.length not in (0, p.COOKIE_BYTES)
                    or self.attached
                    or h.flags
                    or (h.length == 0) == (self.shared is not None)
                ):
                    return refuse(conn, "frame", p.ERR_FRAME)
            elif h.length != (nbytes // 4 * wire.itemsize(narrow) if pushes and not shared else 0):
                return refuse(conn, "size", p.ERR_SIZE)
            if narrow and self.wire is None:
                self.wire = np.empty(
                    self.server.size, np.uint16
                )  # the weights' count, whatever a header says
            into = self.wire if narrow and self.wire is not None else self.inbox
            body = (
                memoryview(cookie)[: h.length]
                if h.op == p.ATTACH
                else into.data.cast("B")[: h.length]
            )
            try:
                if len(body):
                    p.recv_exact(
                        conn, self.session.inlet(h.length, body, self.out_room.data.cast("B"))
                    )
            except ConnectionError:
                return self.transport.broken()
            # Altered, replayed, reordered, or sealed for another connection: it does not open.
            if not self.session.open(h, body, self.out_room.data.cast("B")):
                return refuse(conn, "auth", p.ERR_AUTH)
            if pushes and narrow:
                wire.decode(body, narrow, self.inbox)
            if pushes and not acceptable(
                self.shared.request if shared and self.shared else self.inbox, self.server.max_norm
            ):
                # One NaN, Inf or absurd delta would ruin the center for good: the task fails
                # (its exchange not applied) and Spark retries it.
                return refuse(conn, "nonfinite", p.ERR_VALUE)
            try:
                if h.op == p.ATTACH:
                    self._attach(h, bytes(body))
                elif shared:  # the payloads are in the shared file
                    assert self.shared is not None
                    self._reply(h, self.shared.request, self.shared.response, started, shared=True)
                else:
                    self._reply(h, self.inbox, self.outbox, started)
            except p.ProtocolError:  # a push that skips exchanges of its task
                return refuse(conn, "order", p.ERR_FRAME)

    def _send(self, h: p.Header, payload: bytes | memoryview = b"") -> None:
        """A reply, sealed: its header authenticated, ``payload`` encrypted."""
        header, body = self.session.seal(h, payload, self.in_room.data.cast("B"))
        if len(body) > 4096:
            self.conn.sendall(header)
            self.conn.sendall(body)
        else:
            self.conn.sendall(header + bytes(body))

    def _reply(
        self,
        h: p.Header,
        inbox: np.ndarray,
        outbox: np.ndarray,
        started: float,
        *,
        shared: bool = False,
    ) -> None:
        reply, payload = self.server.answer(h, inbox, outbox, member=id(self.conn), shared=shared)
        narrow = h.flags & wire.MASK
        if narrow and h.op in (p.PULL, p.PEEK, p.PUSH_PULL):  # the center, narrowed for the socket
            assert self.wire is not None
            payload = wire.encode(outbox, narrow, self.wire)
            reply = dataclasses.replace(reply, length=len(payload))
        self._send(reply, payload)
        self.server.counts.finished(p.OPS[h.op], time.perf_counter() - started)

    def _attach(self, h: p.Header, cookie: bytes) -> None:
        """The two ATTACH requests: offer a shared file, then accept the worker's cookie for it."""
        server = self.server
        server.counts.op("attach")
        if not cookie:  # the offer: a token, or none (off, or no room in /dev/shm)
            token = b""
            if self.transport.shared_memory:
                try:
                    self.shared = SharedBuffers.create(server.size)
                    token = self.shared.token.encode()
                except OSError as e:
                    log.info("no shared memory for a worker (%s); it stays on TCP", e)
            self._send(p.Header(p.OK, h.worker, h.seq, server.clock, len(token)), token)
            return
        assert self.shared is not None
        accepted = hmac.compare_digest(cookie, self.shared.cookie)
        self.shared.unlink()  # mapped by both now, or never to be: no name is left behind
        if not accepted:
            self.shared.close()
            self.shared = None
        else:
            server.counts.shared()
        self.attached = accepted
        self._send(p.Header(p.OK, h.worker, h.seq, server.clock, 0, flags=int(accepted)))
