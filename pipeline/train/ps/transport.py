"""The parameter server's transport: the listening socket, the handshake, and each
connection's frames (payloads over the socket, or through a shared-memory file).

It knows the protocol, not the weights: every authenticated, well-formed request is
handed to the server's :meth:`~pipeline.train.ps.server.ParameterServer.answer`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hmac
import logging
import math
import os
import socket
import threading
import time
from typing import TYPE_CHECKING

import numpy as np

from pipeline.errors import ConfigError
from pipeline.train.ps import protocol as p
from pipeline.train.ps import wire
from pipeline.train.ps.refusals import RefusalLog, logger_line
from pipeline.train.ps.shm import SharedBuffers, remove_stale

if TYPE_CHECKING:
    from pipeline.train.ps.server import ParameterServer

log = logging.getLogger(__name__)

#: Authenticated connections served at once (each holds two weight-sized buffers, and may
#: map a shared file and keep a pulled center): more are refused ("busy") after the handshake.
MAX_CONNECTIONS = 64
#: Connections in the handshake at once, a budget of their own: peers without the secret
#: never take an authenticated worker's slot. A newcomer past it evicts the oldest pending
#: handshake of its own address, else the oldest of all ("evicted"): peers that connect and
#: say nothing cannot keep a worker out, they only push each other out (a worker's
#: handshake takes a round trip; theirs run for HANDSHAKE_TIMEOUT_S).
MAX_UNAUTHENTICATED = 32
#: Seconds a peer has for the whole handshake (a deadline, not per read: a byte every 9 s
#: must not hold a slot for minutes), and an authenticated connection may stay silent
#: between requests (a worker computes between exchanges; a sync round waits on the server).
HANDSHAKE_TIMEOUT_S, IDLE_TIMEOUT_S = 10.0, 600.0
#: What seals a connection's frames (bench/ps.py swaps in the HMAC protocol it compares with).
SESSION = p.Session


class Transport:
    """Accepts connections for ``server`` and serves each on its own thread.

    Args:
        server: what answers the requests (and counts refusals).
        host, port: the address to bind (port 0: a free one).
        shared_memory: offer workers on this machine a shared-memory file for payloads.
    """

    def __init__(
        self, server: ParameterServer, *, host: str, port: int, shared_memory: bool
    ) -> None:
        self.server, self.host, self.port, self.shared_memory = server, host, port, shared_memory
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._count_lock = threading.Lock()
        self._authenticated = 0
        #: Connections in the handshake, oldest first, with their peer's address.
        self._pending: collections.OrderedDict[socket.socket, str] = collections.OrderedDict()
        self._evicted: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        # A flood of bad connections (a scanner, a misconfigured client) must not flood the log.
        self._refusals = RefusalLog(logger_line(log))

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    # --- life cycle ---

    def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Reuse the address so a restarted driver can bind the port an interrupted run held.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as e:
            sock.close()
            raise ConfigError(
                f"The parameter server cannot bind {self.host}:{self.port} ({e.strerror}); pass another port, or 0."
            ) from None
        sock.listen(64)
        self._listener = sock
        self.port = sock.getsockname()[1]
        if self.shared_memory:
            remove_stale()
        t = threading.Thread(target=self._accept_loop, name="ps-accept", daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        """Close the listening socket and every connection; the port is free on return."""
        self._stopping.set()
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for conn in list(self._conns):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=5)
        self._threads.clear()
        self._refusals.flush()

    def _accept_loop(self) -> None:
        assert self._listener is not None
        listener = self._listener
        while not self._stopping.is_set():
            try:
                conn, peer = listener.accept()
            except OSError:
                return
            victim = None
            with self._count_lock:
                if len(self._pending) >= MAX_UNAUTHENTICATED:
                    own = next((c for c, a in self._pending.items() if a == peer[0]), None)
                    victim = own if own is not None else next(iter(self._pending))
                    del self._pending[victim]
                    self._evicted.add(victim)
                self._pending[conn] = peer[0]
            if victim is not None:
                self.refuse(victim, "evicted")
                with contextlib.suppress(OSError):
                    victim.shutdown(
                        socket.SHUT_RDWR
                    )  # its handshake's read ends; its thread closes it
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._conns.add(conn)
            t = threading.Thread(target=self._serve, args=(conn,), name="ps-conn", daemon=True)
            t.start()
            self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _serve(self, conn: socket.socket) -> None:
        try:
            try:
                session = self._handshake(conn)
            finally:
                with self._count_lock:
                    self._pending.pop(conn, None)
            if session is not None:
                with self._count_lock:
                    busy = self._authenticated >= MAX_CONNECTIONS
                    self._authenticated += not busy
                if busy:
                    return self.refuse(conn, "busy")
                try:
                    conn.settimeout(IDLE_TIMEOUT_S)
                    _Connection(self, conn, session).serve()
                finally:
                    with self._count_lock:
                        self._authenticated -= 1
        except TimeoutError:
            self.refuse(conn, "idle")
        except (ConnectionError, OSError):
            pass  # a closed or reset connection ends only itself
        finally:
            self._conns.discard(conn)
            with self._count_lock:
                self._evicted.discard(conn)
            conn.close()
            self.server.disconnected(id(conn))

    # --- per connection ---

    def refuse(self, conn: socket.socket, reason: str, status: int | None = None) -> None:
        """Count and log a refusal; answer it with ``status`` (None: the peer is gone)."""
        self.server.counts.refuse(reason)
        self._refusals.refused(reason)
        if status is not None:
            with contextlib.suppress(OSError):
                conn.sendall(p.pack(p.Header(status, 0, 0, self.server.clock, 0)))

    def broken(self) -> None:
        """An authenticated worker's connection broke mid-frame: its process or host died
        (Spark runs its task again), not an outsider's junk, so it is no refusal."""
        if self.stopping:
            return
        self.server.counts.broken()
        log.warning("a worker's connection broke mid-exchange (its process or host is gone)")

    def _handshake(self, conn: socket.socket) -> p.Session | None:
        """Both sides prove the secret; the connection's session, or None if the peer did not."""
        secret = self.server.secret
        nonce = os.urandom(p.NONCE_BYTES)
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
        conn.settimeout(HANDSHAKE_TIMEOUT_S)
        conn.sendall(nonce)
        answer = bytearray(p.NONCE_BYTES + p.PROOF_BYTES)
        try:
            _recv_by(conn, memoryview(answer), deadline)
        except (TimeoutError, ConnectionError) as e:
            if conn not in self._evicted:  # an evicted one was counted as such
                self.refuse(conn, "handshake" if isinstance(e, TimeoutError) else "truncated")
            return None
        theirs, proof = bytes(answer[: p.NONCE_BYTES]), bytes(answer[p.NONCE_BYTES :])
        if not hmac.compare_digest(proof, p.client_proof(secret, nonce, theirs)):
            self.refuse(conn, "auth")
            with contextlib.suppress(OSError):
                conn.sendall(bytes([p.ERR_AUTH]) + bytes(p.PROOF_BYTES))
            return None
        conn.sendall(bytes([p.OK]) + p.server_proof(secret, nonce, theirs))
        return SESSION.server(p.Keys.derive(secret, nonce, theirs))


def _recv_by(conn: socket.socket, buf: memoryview, deadline: float) -> None:
    """Fill ``buf`` before ``deadline`` (``time.monotonic()``), however the bytes trickle in."""
    got = 0
    while got < len(buf):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("handshake deadline")
        conn.settimeout(remaining)
        n = conn.recv_into(buf[got:])
        if n == 0:
            raise ConnectionError("peer closed the connection in the handshake")
        got += n


def acceptable(delta: np.ndarray, max_norm: float | None) -> bool:
    """Whether a pushed buffer is finite with a norm in bounds. Its sum of squares in float32
    is NaN for a NaN, Inf for an Inf or for a norm past ~1.8e19 (finite values up to 3e38
    decode fine): one pass, no copy.

    >>> acceptable(np.ones(4, np.float32), None), acceptable(np.array([1, np.nan], np.float32), None)
    (True, False)
    >>> acceptable(np.array([3e38], np.float32), None), acceptable(np.full(4, 10, np.float32), 5.0)
    (False, False)
    """
    with np.errstate(over="ignore", invalid="ignore"):
        squares = float(np.dot(delta, delta))
    return math.isfinite(squares) and (max_norm is None or squares <= max_norm * max_norm)


class _Connection:
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
