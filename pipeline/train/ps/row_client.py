"""A worker's side of the row servers: one connection per shard, one request per shard per
exchange (:mod:`pipeline.train.ps.row_server`).

The client does the sharding: each key goes to the shard :func:`shard_of` names; the
gradients of IDs read without a row of their own are summed into the shared row, which the
shard that owns :data:`SHARED` holds, and that shared row is what such IDs read from any
shard. So a run on any number of shards makes exactly the tables one shard would.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import numpy as np

from pipeline.train.ps import protocol as p
from pipeline.train.ps.channel import Channel, Sent
from pipeline.train.ps.row_server import MAX_BYTES, encode
from pipeline.train.ps.rows import SHARED, shard_of

#: One table's push: each record's key, the gradient of its row, and whether it read a row of
#: its own (else its gradient is the shared row's).
Push = tuple[np.ndarray, np.ndarray, np.ndarray]
#: One table's push grouped by key (:func:`grouped`): the rows' keys, sorted and distinct,
#: their gradients' sums (the IDs read without a row of their own summed into
#: :data:`SHARED`'s), and every ID of the batch, sorted and distinct, with its count (its
#: sightings).
Grouped = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def grouped(
    unique: np.ndarray, inverse: np.ndarray, owned: np.ndarray, grads: np.ndarray
) -> Grouped:
    """A table's push from its batch's ``unique`` keys (sorted, as np.unique gives them),
    each record's place among them (``inverse``), whether each key read a row of its own
    (``owned``) and each record's gradient.

    >>> keys, sums, seen, counts = grouped(
    ...     np.array([3, 8, 9], np.uint64), np.array([0, 2, 0, 1]),
    ...     np.array([True, False, True]), np.arange(4, dtype=np.float32)[:, None])
    >>> keys.tolist() == [3, 9, int(SHARED)], sums.ravel().tolist(), counts.tolist()
    (True, [2.0, 1.0, 3.0], [2, 1, 1])
    """
    counts = np.bincount(inverse, minlength=len(unique))
    if not len(inverse):
        return unique, np.zeros((0, *grads.shape[1:]), np.float32), unique, counts
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    # Each key's records in their order (a stable sort), summed: what np.add.at gives, in a
    # fraction of its time.
    sums = np.add.reduceat(grads[np.argsort(inverse, kind="stable")], starts, axis=0)
    own = owned & (unique != SHARED)
    keys, rows = unique[own], sums[own]
    if not own.all():  # SHARED is the largest key: the order holds
        keys = np.append(keys, SHARED)
        rows = np.concatenate([rows, sums[~own].sum(axis=0, keepdims=True)])
    return keys, rows.astype(np.float32, copy=False), unique, counts


def group(push: Push) -> Grouped:
    """:func:`grouped` from a table's push record by record."""
    keys, grads, has_row = push
    unique, inverse = np.unique(np.asarray(keys, np.uint64), return_inverse=True)
    owned = np.zeros(len(unique), bool)
    owned[inverse] = has_row
    return grouped(unique, inverse, owned, np.asarray(grads, np.float32).reshape(len(keys), -1))


class RowClient:
    """Connections to every shard of the run's row servers, for one worker.

    Args:
        addresses: each shard's ``(host, port)``, in shard order.
        secret: the run's secret.
        worker: the worker's id.
        dims: each table's row size, in the servers' order.

    Attributes:
        staleness: per applied push, the pushes of other workers between this worker's last
            read and it (the most over the shards).
        rows_read, rows_pushed: rows this client read and pushed.
        sighting: whether a push counts its IDs as seen (``min_count``; the rows it trains
            have their expiry moved either way); off while a record is trained again (a later
            pass, a replay after a drift), so that each record's IDs are counted once.
    """

    def __init__(
        self,
        addresses: list[tuple[str, int]] | tuple[tuple[str, int], ...],
        *,
        secret: bytes,
        worker: int,
        dims: list[int],
        timeout_s: float = 60.0,
    ) -> None:
        self.dims = list(dims)
        self.shards = len(addresses)
        self._owner = int(shard_of(np.array([SHARED], np.uint64), self.shards)[0])
        self._clock = [0] * self.shards
        self.staleness: list[int] = []
        self.rows_read = self.rows_pushed = 0
        self.repeats = 0
        self.sighting = True
        self._sent: Any = None  # the requests in flight (send, then receive)
        self._channels: list[Channel] = []
        try:
            for address in addresses:
                self._channels.append(
                    Channel(
                        tuple(address),  # type: ignore[arg-type]
                        secret=secret,
                        worker=worker,
                        size=0,
                        timeout_s=timeout_s,
                        shared_memory=False,
                        wire_dtype="float32",
                    )
                )
        except BaseException:
            self.close()
            raise

    def exchange(
        self,
        reads: list[np.ndarray] | None,
        push: list[Push] | None = None,
        *,
        task: int = 0,
        exchange: int = 0,
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Push (once per ``task`` and ``exchange``, where given) and read: per table, the
        rows of ``reads``' keys ``(n, dim)`` and which have a row of their own."""
        together = None if push is None else [group(t) for t in push]
        self.send(reads, together, task=task, exchange=exchange)
        return self.receive()

    def send(
        self,
        reads: list[np.ndarray] | None,
        push: list[Grouped] | None = None,
        *,
        task: int = 0,
        exchange: int = 0,
    ) -> None:
        """:meth:`exchange`'s requests, one to each shard, sent without waiting for the
        replies (:meth:`receive` takes them): the worker goes on meanwhile. ``reads`` None:
        nothing read."""
        assert self._sent is None, "a row request is already in flight"
        if reads is None:
            reads = [np.zeros(0, np.uint64)] * len(self.dims)
        n = self.shards
        empty = _empty_request(self.dims)
        requests = [[dict(t) for t in empty] for _ in range(n)]
        if push is not None:
            for t, together in enumerate(push):
                self._split_push(requests, t, together)
        wanted: list[tuple[np.ndarray, np.ndarray]] = []
        for t, keys in enumerate(reads):
            keys = np.asarray(keys, np.uint64)
            where = self._where(keys)
            wanted.append((keys, where))
            for s in range(n):
                mine = keys[where == s]
                if s == self._owner:  # what an ID without a row reads, from any shard
                    mine = np.concatenate([mine, np.array([SHARED], np.uint64)])
                requests[s][t]["read"] = mine
        sent = [
            self._channels[s].send(
                p.ROWS,
                body=encode(requests[s]),
                most=MAX_BYTES,
                clock=self._clock[s],
                task=task,
                exchange=exchange,
                steps=int(push is not None),
            )
            for s in range(n)
        ]
        self._sent = (sent, requests, wanted, push is not None)

    def receive(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The replies to the requests :meth:`send` sent: per table, the rows read and which
        have a row of their own."""
        assert self._sent is not None, "no row request in flight"
        sent, requests, wanted, pushes = self._sent
        self._sent = None
        answers = [self._reply(s, sent[s], requests[s], pushes) for s in range(self.shards)]
        out = []
        for t, (keys, where) in enumerate(wanted):
            dim = self.dims[t]
            values = np.empty((len(keys), dim), np.float32)
            has_row = np.zeros(len(keys), bool)
            for s in range(self.shards):
                got, rowed = answers[s][t]
                mine = where == s
                if s == self._owner:
                    shared, got, rowed = got[-1], got[:-1], rowed[:-1]
                values[mine], has_row[mine] = got, rowed
            values[~has_row] = shared
            self.rows_read += len(keys)
            out.append((values, has_row))
        return out

    def applied(self, task: int) -> int:
        """The steps of ``task`` whose pushes every shard has applied (an earlier attempt's)."""
        empty = encode(_empty_request(self.dims))  # a read of nothing: its reply says
        done = [
            c.request(p.ROWS, body=empty, most=MAX_BYTES, clock=k, task=task)[0].exchange
            for c, k in zip(self._channels, self._clock, strict=True)
        ]
        return min(done)

    def _where(self, keys: np.ndarray) -> np.ndarray:
        """Each key's shard (one shard: no hashing)."""
        if self.shards == 1:
            return np.zeros(len(keys), np.int64)
        return shard_of(keys, self.shards)

    def push(self, push: list[Push], *, task: int = 0, exchange: int = 0) -> None:
        """Push alone (nothing read)."""
        self.exchange(None, push, task=task, exchange=exchange)

    def _split_push(
        self, requests: list[list[dict[str, np.ndarray]]], t: int, push: Grouped
    ) -> None:
        keys, sums, seen, counts = push
        if not self.sighting:
            seen, counts = seen[:0], counts[:0]
        where, at = self._where(keys), self._where(seen)
        for s in range(self.shards):
            mine, sighted = where == s, at == s
            requests[s][t]["keys"], requests[s][t]["grads"] = keys[mine], sums[mine]
            requests[s][t]["sighted"] = seen[sighted]
            requests[s][t]["counts"] = counts[sighted].astype(np.uint32)
        self.rows_pushed += len(keys)

    def _reply(
        self, s: int, sent: Sent, tables: list[dict[str, np.ndarray]], pushes: bool
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        reply, payload = self._channels[s].receive(sent)
        self._clock[s] = reply.clock
        if pushes and s == 0:
            self.staleness.append(0)
        if pushes:
            self.staleness[-1] = max(self.staleness[-1], reply.flags)
            self.repeats += int(not reply.steps) if s == 0 else 0
        out, at = [], 0
        data = bytes(payload)
        for t, dim in enumerate(self.dims):
            r = len(tables[t]["read"])
            size = r * dim * 4
            if at + size + r > len(data):
                raise p.ProtocolError("a row server's reply shorter than the rows asked for")
            values = np.frombuffer(data, "<f4", r * dim, at).reshape(r, dim)
            has_row = np.frombuffer(data, np.uint8, r, at + size).astype(bool)
            at += size + r
            out.append((values, has_row))
        return out

    def close(self) -> None:
        for c in self._channels:
            c.close()

    def __enter__(self) -> RowClient:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _empty_request(dims: list[int]) -> list[dict[str, np.ndarray]]:
    return [
        {
            "keys": np.zeros(0, np.uint64),
            "grads": np.zeros((0, d), np.float32),
            "sighted": np.zeros(0, np.uint64),
            "counts": np.zeros(0, np.uint32),
            "read": np.zeros(0, np.uint64),
        }
        for d in dims
    ]
