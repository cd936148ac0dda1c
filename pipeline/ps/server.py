"""The parameter server: center weights as one flat float32 buffer, served over TCP.

It knows neither Spark nor TensorFlow. An update rule (``rule``) is a function
that changes the center in place from a worker's delta; the server applies it,
advances the clock and records the push's staleness under one lock, so no update
is lost and clock and staleness always agree.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hmac
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import numpy as np

from pipeline.errors import ConfigError
from pipeline.ps import protocol as p
from pipeline.ps.shm import SharedBuffers, remove_stale

log = logging.getLogger(__name__)

#: ``rule(center, delta, staleness=..., pulled=...)`` changes ``center`` in place.
Rule = Callable[..., None]


def add_delta(center: np.ndarray, delta: np.ndarray, **_: Any) -> None:
    """The DOWNPOUR rule: center += delta."""
    np.add(center, delta, out=center)


@dataclasses.dataclass
class _Stats:
    refused: dict[str, int] = dataclasses.field(default_factory=dict)
    ops: dict[str, int] = dataclasses.field(default_factory=dict)
    op_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    staleness: dict[int, int] = dataclasses.field(default_factory=dict)
    shared: int = 0  # connections that attached shared memory

    def refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1


class ParameterServer:
    """Serves pull and push of one flat float32 weight buffer.

    Args:
        weights: initial center weights (copied, flattened to float32).
        secret: the per-run secret clients must prove they hold.
        host: address to bind; loopback unless workers run on other machines.
        port: 0 picks a free port.
        rule: the update rule applied to each push (default: center += delta).
        keep_pulled: keep each worker's last pulled center, for rules that use it.
        sync_workers: if > 0, pushes are synchronous rounds: a round applies the
            mean of one push from each worker at once (model averaging, synchronous
            SGD), and each push_pull waits for its round. ``sync_workers`` workers are
            expected (:meth:`expect_workers` changes it); a worker that disconnects
            leaves the rounds, so the others go on without it. A round that waits
            ``sync_timeout_s`` closes with the pushes it has (a worker that hangs).
        state: the update rule's own state (an object with ``server_state()`` and
            ``load_server_state(dict)``, such as an algorithm with a server-side
            optimizer), read by :meth:`checkpoint` under the same lock as the center.
        on_request: called with the operation's name and its seconds on the server
            after each answered request (for metrics); it must be cheap and thread-safe.
        shared_memory: offer workers on this machine a shared-memory file instead
            of the socket for payloads (:mod:`pipeline.ps.shm`); they fall back to
            TCP when they cannot map it.

    Example:
        >>> import numpy as np
        >>> from pipeline.ps import Client
        >>> with ParameterServer(np.zeros(3, np.float32), secret=b"s") as server:
        ...     with Client(server.address, secret=b"s", worker=0, size=3) as c:
        ...         _ = c.pull()
        ...         c.push_pull(np.ones(3, np.float32)).tolist(), server.clock
        ([1.0, 1.0, 1.0], 1)
    """

    def __init__(
        self,
        weights: np.ndarray,
        *,
        secret: bytes,
        host: str = "127.0.0.1",
        port: int = 0,
        rule: Rule = add_delta,
        keep_pulled: bool = False,
        sync_workers: int = 0,
        sync_timeout_s: float = 30.0,
        on_request: Callable[[str, float], None] | None = None,
        state: Any = None,
        shared_memory: bool = True,
    ) -> None:
        if not secret:
            raise ConfigError("The parameter server needs a non-empty secret.")
        self.center = np.array(weights, dtype=np.float32).ravel()
        self.size = self.center.size
        self.secret = secret
        self.host, self.port = host, port
        self.rule = rule
        self.keep_pulled = keep_pulled
        self.clock = 0
        self.sync_workers = sync_workers
        self.sync_timeout_s = sync_timeout_s
        self.on_request = on_request
        self.shared_memory = shared_memory
        self._lock = threading.Lock()
        self._round_done = threading.Condition(self._lock)
        self._round_sum = np.zeros(self.size, np.float32) if sync_workers else None
        self._round_count = 0
        self._members: set[int] = set()  # connections in the synchronous rounds
        self._left = 0  # members that left since the rounds last had none
        self.state = state
        self._last_pulled: dict[int, int] = {}
        self._pulled: dict[int, np.ndarray] = {}
        self._stats = _Stats()
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    # --- life cycle ---

    def start(self) -> ParameterServer:
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
        atexit.register(self.stop)
        return self

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
        atexit.unregister(self.stop)

    def __enter__(self) -> ParameterServer:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # --- state ---

    def weights(self) -> np.ndarray:
        """A consistent copy of the center weights."""
        with self._lock:
            return self.center.copy()

    def snapshot(self) -> tuple[np.ndarray, int]:
        """The center weights and the clock, taken together under the lock."""
        with self._lock:
            return self.center.copy(), self.clock

    def checkpoint(self) -> tuple[np.ndarray, int, dict[str, np.ndarray]]:
        """The center, the clock and the rule's state, taken together under the lock."""
        with self._lock:
            state = self.state.server_state() if self.state is not None else {}
            return self.center.copy(), self.clock, state

    def restore(self, weights: np.ndarray, clock: int, state: dict[str, np.ndarray] | None = None) -> None:
        """Replace the center, the clock and the rule's state (resuming from a checkpoint)."""
        flat = np.asarray(weights, np.float32).ravel()
        if flat.size != self.size:
            raise ConfigError(f"Expected {self.size} weights to restore. Received: {flat.size}")
        with self._lock:
            np.copyto(self.center, flat)
            self.clock = clock
            if state and self.state is not None:
                self.state.load_server_state(state)
            self._last_pulled.clear()
            self._pulled.clear()

    def stats(self) -> dict[str, Any]:
        """Clock, op counts and seconds, refusals by reason, staleness histogram."""
        with self._lock:
            s = self._stats
            return {
                "clock": self.clock, "size": self.size, "workers": len(self._last_pulled),
                "ops": dict(s.ops), "op_seconds": dict(s.op_seconds), "refused": dict(s.refused),
                "shared_memory": s.shared,
                "staleness": {str(k): v for k, v in sorted(s.staleness.items())},
            }

    # --- serving ---

    def _accept_loop(self) -> None:
        assert self._listener is not None
        listener = self._listener
        while not self._stopping.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._conns.add(conn)
            t = threading.Thread(target=self._serve, args=(conn,), name="ps-conn", daemon=True)
            t.start()
            self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _refuse(self, conn: socket.socket, reason: str, status: int) -> None:
        with self._lock:
            self._stats.refuse(reason)
        with contextlib.suppress(OSError):
            conn.sendall(p.pack(p.Header(status, 0, 0, self.clock, 0)))
        log.warning("parameter server refused a %s request (%s)", reason, status)

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._serve_conn(conn)
        except (ConnectionError, OSError):
            pass  # a closed or reset connection ends only itself
        finally:
            self._conns.discard(conn)
            conn.close()
            if self.sync_workers:
                self._leave(id(conn))

    def _handshake(self, conn: socket.socket) -> bytes | None:
        nonce = os.urandom(p.NONCE_BYTES)
        conn.sendall(nonce)
        answer = bytearray(32)
        conn.settimeout(10)
        try:
            p.recv_exact(conn, memoryview(answer))
        except (ConnectionError, TimeoutError):
            with self._lock:
                self._stats.refuse("truncated")
            return None
        conn.settimeout(None)
        if not hmac.compare_digest(bytes(answer), p.challenge_answer(self.secret, nonce)):
            self._refuse(conn, "auth", p.ERR_AUTH)
            return None
        return p.session_key(self.secret, nonce)

    def _serve_conn(self, conn: socket.socket) -> None:
        key = self._handshake(conn)
        if key is None:
            return
        nbytes = self.size * 4
        # One receive and one send buffer per connection, allocated once: a request's
        # declared length never decides an allocation.
        inbox = np.empty(self.size, np.float32)
        outbox = np.empty(self.size, np.float32)
        raw = bytearray(p.HEADER.size)
        seq = 0
        shared: SharedBuffers | None = None  # offered to this connection
        attached = False  # and mapped by its worker
        try:
            while not self._stopping.is_set():
                try:
                    p.recv_exact(conn, memoryview(raw))
                except ConnectionError:
                    return
                started = time.perf_counter()
                try:
                    h = p.unpack(raw)
                except p.ProtocolError:
                    return self._refuse(conn, "frame", p.ERR_FRAME)
                seq += 1
                if h.seq != seq or not p.verify(key, h):
                    return self._refuse(conn, "auth", p.ERR_AUTH)
                if h.op not in p.OPS or h.flags & ~p.SHARED or (h.flags and not attached):
                    return self._refuse(conn, "frame", p.ERR_FRAME)
                if h.op == p.ATTACH:
                    if h.length not in (0, p.COOKIE_BYTES) or attached or (h.length == 0) == (shared is not None):
                        return self._refuse(conn, "frame", p.ERR_FRAME)
                    cookie = bytearray(h.length)
                    p.recv_exact(conn, memoryview(cookie))
                    shared, attached = self._attach(conn, h, shared, bytes(cookie))
                    continue
                pushes = h.op in (p.PUSH, p.PUSH_PULL)
                if h.length != (nbytes if pushes else 0):
                    return self._refuse(conn, "size", p.ERR_SIZE)
                if h.flags:  # the payloads are in the shared file
                    assert shared is not None
                    self._answer(conn, h, shared.request, shared.response, started, shared=True)
                    continue
                if pushes:
                    try:
                        p.recv_exact(conn, inbox.data.cast("B"))
                    except ConnectionError:
                        with self._lock:
                            self._stats.refuse("truncated")
                        return
                self._answer(conn, h, inbox, outbox, started)
        finally:
            if shared is not None:
                shared.close()

    def _attach(self, conn: socket.socket, h: p.Header, shared: SharedBuffers | None,
                cookie: bytes) -> tuple[SharedBuffers | None, bool]:
        """The two ATTACH requests: offer a shared file, then accept the worker's cookie for it."""
        with self._lock:
            ops = self._stats.ops
            ops["attach"] = ops.get("attach", 0) + 1
        if not cookie:  # the offer: a token, or none (off, or no room in /dev/shm)
            token = b""
            if self.shared_memory:
                try:
                    shared = SharedBuffers.create(self.size)
                    token = shared.token.encode()
                except OSError as e:
                    log.info("no shared memory for a worker (%s); it stays on TCP", e)
            conn.sendall(p.pack(p.Header(p.OK, h.worker, h.seq, self.clock, len(token))) + token)
            return shared, False
        assert shared is not None
        accepted = hmac.compare_digest(cookie, shared.cookie)
        shared.unlink()  # mapped by both now, or never to be: no name is left behind
        if not accepted:
            shared.close()
            shared = None
        else:
            with self._lock:
                self._stats.shared += 1
        conn.sendall(p.pack(p.Header(p.OK, h.worker, h.seq, self.clock, 0, flags=int(accepted))))
        return shared, accepted

    def expect_workers(self, n: int) -> None:
        """How many workers the next synchronous rounds wait for (call between jobs)."""
        with self._lock:
            self.sync_workers = max(1, n)
            self._left = 0 if not self._members else self._left

    def _round_size(self) -> int:
        # The expected workers less those that left, or more if more joined.
        return max(1, len(self._members), self.sync_workers - self._left)

    def _leave(self, member: int) -> None:
        with self._lock:
            if member not in self._members:
                return
            self._members.discard(member)
            self._left = self._left + 1 if self._members else 0
            if self._round_count and self._round_count >= self._round_size():
                self._close_round()

    def _close_round(self) -> None:
        """Apply the mean of the round's pushes (lock held)."""
        assert self._round_sum is not None
        self._round_sum *= np.float32(1.0 / self._round_count)
        self.rule(self.center, self._round_sum, staleness=0, pulled=None)
        hist = self._stats.staleness
        hist[0] = hist.get(0, 0) + self._round_count
        self._round_sum.fill(0)
        self._round_count = 0
        self.clock += 1
        self._round_done.notify_all()

    def _join_round(self, delta: np.ndarray) -> None:
        """Add ``delta`` to this round and wait until the round is applied (lock held)."""
        assert self._round_sum is not None
        np.add(self._round_sum, delta, out=self._round_sum)
        self._round_count += 1
        clock = self.clock
        if self._round_count >= self._round_size():
            self._close_round()
            return
        self._round_done.wait_for(lambda: self.clock != clock, timeout=self.sync_timeout_s)
        if self.clock == clock:  # the wait timed out: apply what came
            log.warning("a synchronous round waited %.0f s for %d of %d workers; applying it without them",
                        self.sync_timeout_s, self._round_size() - self._round_count, self._round_size())
            self._close_round()

    def _answer(self, conn: socket.socket, h: p.Header, inbox: np.ndarray, outbox: np.ndarray, started: float,
                *, shared: bool = False) -> None:
        staleness = 0
        payload: memoryview | bytes = b""
        with self._lock:
            if self.sync_workers and h.op != p.STATS:
                self._members.add(id(conn))
            if h.op in (p.PUSH, p.PUSH_PULL) and self.sync_workers:
                self._join_round(inbox)
            elif h.op in (p.PUSH, p.PUSH_PULL):
                # Staleness from the server's own record of this worker's last pull;
                # the worker's claimed clock is used only before its first pull.
                pulled_at = self._last_pulled.get(h.worker, h.clock)
                staleness = max(0, self.clock - pulled_at)
                self.rule(self.center, inbox, staleness=staleness, pulled=self._pulled.get(h.worker))
                self.clock += 1
                hist = self._stats.staleness
                hist[staleness] = hist.get(staleness, 0) + 1
            if h.op in (p.PULL, p.PUSH_PULL):
                np.copyto(outbox, self.center)
                self._last_pulled[h.worker] = self.clock
                if self.keep_pulled:
                    kept = self._pulled.setdefault(h.worker, np.empty_like(self.center))
                    np.copyto(kept, self.center)
                payload = b"" if shared else outbox.data.cast("B")  # shared: already in the file
            clock = self.clock
            stats_now = h.op == p.STATS
            # Counted before the reply leaves: a client that reads stats right after
            # its last answer must see that request counted.
            ops = self._stats.ops
            ops[p.OPS[h.op]] = ops.get(p.OPS[h.op], 0) + 1
        if stats_now:
            payload = json.dumps(self.stats()).encode()
        conn.sendall(p.pack(p.Header(p.OK, h.worker, h.seq, clock, len(payload), flags=min(staleness, 0xFFFF))))
        if len(payload):
            conn.sendall(payload)
        name, took = p.OPS[h.op], time.perf_counter() - started
        with self._lock:
            secs = self._stats.op_seconds
            secs[name] = secs.get(name, 0.0) + took
        if self.on_request is not None:
            self.on_request(name, took)
