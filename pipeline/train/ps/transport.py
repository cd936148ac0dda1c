"""The parameter server's transport: the listening socket, the handshake, and the caps on
connections; each authenticated connection is served by a
:class:`~pipeline.train.ps.connection.Connection` on its own thread.
"""

from __future__ import annotations

import collections
import contextlib
import hmac
import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from pipeline.errors import ConfigError
from pipeline.train.ps import protocol as p
from pipeline.train.ps.connection import Connection
from pipeline.train.ps.refusals import RefusalLog, logger_line
from pipeline.train.ps.shm import remove_stale

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
        connection: what serves each authenticated connection (a row server's own).
    """

    def __init__(
        self,
        server: ParameterServer | Any,
        *,
        host: str,
        port: int,
        shared_memory: bool,
        connection: Any = Connection,
    ) -> None:
        self.server, self.host, self.port, self.shared_memory = server, host, port, shared_memory
        self._connection = connection
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
                f"The parameter server cannot bind {self.host}:{self.port} ({e.strerror}); "
                "pass another port, or 0."
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
                    self._connection(self, conn, session).serve()
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
