"""A row server: one shard of a run's embedding tables, served to workers by the ID.

Dense weights go whole to every worker; rows go by the batch's IDs, so the tables live in
servers of their own (one per ``--ps-shards``, each holding the keys :func:`shard_of` gives
it), behind the same handshake and sealed frames as the parameter server
(:mod:`pipeline.train.ps.protocol`, op ROWS) on a transport of the same caps.

One ROWS request carries, for each table in order, a push (the gradients of the rows the
worker read, and the sightings of its batch's IDs) and the keys it wants to read next;
the reply carries those rows, and which keys have a row of their own. A push names its task
and its step (``exchange``) and is applied once, however often Spark runs the task
(:class:`~pipeline.train.ps.tasks.TaskProgress`); a read changes nothing. The server's
``now`` (records trained before the batch under way) is the tables' clock for ``ttl``: the
driver moves it, and expires rows, between batches, so that a replay of the same batches
makes the same tables.

Request payload, little-endian, per table: ``u32`` gradient rows, ``u32`` sightings, ``u32``
reads; then per table: gradient keys ``u64[]``, gradients ``f32[rows, dim]``, sighted keys
``u64[]``, their counts ``u32[]``, keys to read ``u64[]``. Reply payload per table: the rows
read ``f32[reads, dim]``, then whether each has a row of its own ``u8[reads]``.

Example:
    >>> from pipeline.train.ps.row_client import RowClient
    >>> spec = RowSpec("item", dim=2)
    >>> with RowServer([spec], secret=b"s") as server:
    ...     with RowClient([server.address], secret=b"s", worker=0, dims=[2]) as c:
    ...         keys = np.array([5, 5, 6], np.uint64)
    ...         _, has_row = c.exchange([keys])[0]
    ...         c.push([(keys, np.ones((3, 2), np.float32), has_row)], task=0, exchange=0)
    ...         c.exchange([keys])[0][1].tolist(), server.stats()["tables"]["item"]["rows"]
    ([True, True, True], 2)
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import numpy as np

from pipeline.errors import ConfigError
from pipeline.train.ps import protocol as p
from pipeline.train.ps.rows import RowSpec, RowTable, shard_of
from pipeline.train.ps.stats import Counts
from pipeline.train.ps.tasks import TaskProgress
from pipeline.train.ps.transport import Transport

#: The most a ROWS request or reply may carry (a header never sizes a buffer beyond it).
MAX_BYTES = 64 << 20
_COUNTS = struct.Struct("<III")


def parse(body: memoryview | bytes, dims: list[int]) -> list[dict[str, np.ndarray]]:
    """A ROWS request's payload, per table; :class:`ProtocolError` where it does not add up.

    >>> body = encode([{"keys": np.array([3], np.uint64), "grads": np.ones((1, 2), np.float32),
    ...     "sighted": np.array([3], np.uint64), "counts": np.array([2], np.uint32),
    ...     "read": np.array([3, 4], np.uint64)}])
    >>> [(k, v.tolist()) for k, v in parse(body, [2])[0].items()][-1]
    ('read', [3, 4])
    """
    body = memoryview(body)
    head = _COUNTS.size * len(dims)
    if len(body) < head:
        raise p.ProtocolError("a rows request shorter than its counts")
    counts = [_COUNTS.unpack_from(body, i * _COUNTS.size) for i in range(len(dims))]
    need = head + sum(
        g * (8 + 4 * d) + s * 12 + r * 8 for (g, s, r), d in zip(counts, dims, strict=True)
    )
    if need != len(body):
        raise p.ProtocolError(f"a rows request of {len(body)} bytes whose counts make {need}")
    out, at = [], head

    def take(n: int, dtype: Any) -> np.ndarray:
        nonlocal at
        size = n * np.dtype(dtype).itemsize
        arr = np.frombuffer(body[at : at + size], dtype)
        at += size
        return arr

    for (g, s, r), d in zip(counts, dims, strict=True):
        out.append(
            {
                "keys": take(g, "<u8"),
                "grads": take(g * d, "<f4").reshape(g, d),
                "sighted": take(s, "<u8"),
                "counts": take(s, "<u4"),
                "read": take(r, "<u8"),
            }
        )
    return out


def encode(tables: list[dict[str, np.ndarray]]) -> bytes:
    """A ROWS request's payload (:func:`parse` reads it)."""
    head = b"".join(_COUNTS.pack(len(t["keys"]), len(t["sighted"]), len(t["read"])) for t in tables)
    parts = [head]
    for t in tables:
        parts += [
            np.ascontiguousarray(t["keys"], "<u8").tobytes(),
            np.ascontiguousarray(t["grads"], "<f4").tobytes(),
            np.ascontiguousarray(t["sighted"], "<u8").tobytes(),
            np.ascontiguousarray(t["counts"], "<u4").tobytes(),
            np.ascontiguousarray(t["read"], "<u8").tobytes(),
        ]
    return b"".join(parts)


class RowServer:
    """One shard of the run's ID tables, served on its own port.

    Args:
        specs: the tables, in the order requests name them.
        secret: the run's secret (the parameter server's).
        host, port: where to listen (port 0: a free one).
        shard, shards: which of how many shards this is (a request's keys must be its own).
        on_request, on_refusal: as the parameter server's (metrics).
    """

    def __init__(
        self,
        specs: list[RowSpec],
        *,
        secret: bytes,
        host: str = "127.0.0.1",
        port: int = 0,
        shard: int = 0,
        shards: int = 1,
        on_request: Callable[[str, float], None] | None = None,
        on_refusal: Callable[[str], None] | None = None,
    ) -> None:
        if not secret:
            raise ConfigError("The row server needs a non-empty secret.")
        self.secret, self.specs, self.shard, self.shards = secret, list(specs), shard, shards
        self.dims = [s.dim for s in self.specs]
        self._lock = threading.Lock()
        self.counts = Counts(self._lock, on_request=on_request, on_refusal=on_refusal)
        self.tables = [RowTable(s) for s in self.specs]
        self.clock = 0  # pushes applied
        self.now = 0  # records trained before the batch under way: ttl's clock
        self._tasks = TaskProgress()
        self.rows_read = self.rows_pushed = 0
        self._transport = Transport(
            self, host=host, port=port, shared_memory=False, connection=RowConnection
        )

    # --- life cycle ---

    @property
    def address(self) -> tuple[str, int]:
        return self._transport.host, self._transport.port

    def start(self) -> RowServer:
        self._transport.start()
        return self

    def stop(self) -> None:
        self._transport.stop()

    def __enter__(self) -> RowServer:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def disconnected(self, member: int) -> None:
        return None  # a row server keeps nothing per connection

    # --- the driver's ---

    def advance(self, records: int) -> int:
        """A batch of ``records`` is done: the tables' clock moves on, and the rows and counts
        not seen for ``ttl`` records go. Returns the rows dropped."""
        with self._lock:
            self.now += records
            return sum(t.expire(now=self.now) for t in self.tables)

    def changes(self, *, snapshot: bool) -> list[dict[str, Any]]:
        """Each table's rows changed since the last call (a delta), or all of them."""
        with self._lock:
            return [t.snapshot() if snapshot else t.delta() for t in self.tables]

    def load(self, changes: list[dict[str, Any]], *, now: int) -> None:
        """Apply a snapshot or a delta per table (a resumed run's), at the tables' clock ``now``."""
        with self._lock:
            for table, change in zip(self.tables, changes, strict=True):
                table.load(change)
            self.now = now

    def rows(self, t: int) -> dict[str, np.ndarray]:
        """Table ``t``'s rows (:meth:`RowTable.rows`)."""
        with self._lock:
            return self.tables[t].rows()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "clock": self.clock,
                "now": self.now,
                "rows_read": self.rows_read,
                "rows_pushed": self.rows_pushed,
                "repeats_dropped": self._tasks.repeats,
                "tables": {
                    t.spec.name: {
                        "rows": len(t),
                        "bytes": t.nbytes(),
                        "created": t.created,
                        "expired": t.expired,
                    }
                    for t in self.tables
                },
                **self.counts.stats.as_dict(),
            }

    # --- the workers' ---

    def answer(self, h: p.Header, body: memoryview) -> tuple[p.Header, bytes]:
        """Apply one authenticated ROWS request: its push once, then its reads."""
        tables = parse(body, self.dims)
        if self.shards > 1:  # one shard holds every key: nothing to check
            mine = np.concatenate([t[k] for t in tables for k in ("keys", "sighted", "read")])
            if len(mine) and (shard_of(mine, self.shards) != self.shard).any():
                raise p.ProtocolError("keys of another shard", reason="frame")
        if any(not np.isfinite(t["grads"]).all() for t in tables):
            raise p.ProtocolError("a gradient that is not finite", reason="nonfinite")
        pushes = h.steps == 1
        staleness = 0
        with self._lock:
            applies = pushes and (
                not h.task or self._tasks.admit(h.task, exchange=h.exchange, steps=1)
            )
            parts = []
            for table, t in zip(self.tables, tables, strict=True):
                if applies:  # the push, the sightings, then the read
                    push, seen = (t["keys"], t["grads"]), (t["sighted"], t["counts"])
                    values, has_row = table.apply(push, seen, t["read"], now=self.now)
                    self.rows_pushed += len(t["keys"])
                else:
                    values, has_row = table.read(t["read"])
                parts += [values.astype("<f4").tobytes(), has_row.astype(np.uint8).tobytes()]
                self.rows_read += len(t["read"])
            if applies:
                staleness = max(0, self.clock - h.clock)
                self.counts.stats.count_staleness(staleness)
                self.clock += 1
            exchange = self._tasks.applied(h.task)[0] if h.task else 0
            clock = self.clock
            self.counts.stats.count_op("rows")
        payload = b"".join(parts)
        reply = p.Header(
            p.OK,
            h.worker,
            h.seq,
            clock,
            len(payload),
            flags=min(staleness, 0xFFFF),
            task=h.task,
            exchange=exchange,
            steps=int(applies),
        )
        return reply, payload


def answer_driver(server: RowServer, op: str, arg: Any) -> Any:
    """The driver's request ``op`` of a row server, in the driver's process or in a shard's
    (:mod:`pipeline.train.shard_process`): the same answer either way."""
    if op == "advance":
        return server.advance(arg)
    if op == "changes":
        return server.changes(snapshot=arg)
    if op == "load":
        changes, now = arg
        return server.load(changes, now=now)
    if op == "rows":
        return server.rows(arg)
    if op == "stats":
        return server.stats()
    raise ValueError(f"unknown request {op!r}")


class RowConnection:
    """One authenticated worker's ROWS requests, answered in order (the transport's
    counterpart of :class:`~pipeline.train.ps.connection.Connection`)."""

    def __init__(self, transport: Transport, conn: Any, session: p.Session) -> None:
        self.transport, self.conn, self.session = transport, conn, session
        self.server: RowServer = transport.server  # type: ignore[assignment]

    def serve(self) -> None:
        try:
            self._loop()
        except TimeoutError:
            raise  # idle: counted by the transport
        except OSError:
            self.transport.broken()

    def _loop(self) -> None:
        conn, refuse = self.conn, self.transport.refuse
        raw = bytearray(p.HEADER.size)
        seq = 0
        while not self.transport.stopping:
            try:
                p.recv_exact(conn, memoryview(raw))
            except p.Closed:
                return
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
            if h.op != p.ROWS or h.flags:
                return refuse(conn, "frame", p.ERR_FRAME)
            if h.length > MAX_BYTES:
                return refuse(conn, "size", p.ERR_SIZE)
            body = bytearray(h.length)
            try:
                if h.length:
                    p.recv_exact(conn, self.session.inlet(h.length, memoryview(body)))
            except ConnectionError:
                return self.transport.broken()
            if not self.session.open(h, memoryview(body)):
                return refuse(conn, "auth", p.ERR_AUTH)
            try:
                reply, payload = self.server.answer(h, memoryview(body))
            except p.ProtocolError as e:
                status = p.ERR_VALUE if e.reason == "nonfinite" else p.ERR_FRAME
                return refuse(conn, e.reason or "frame", status)
            header, sealed = self.session.seal(reply, payload)
            conn.sendall(header + bytes(sealed))
            self.server.counts.finished("rows", time.perf_counter() - started)
