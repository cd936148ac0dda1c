"""A run's ID tables on the driver: one row server per ``--ps-shards``, and what the driver
does with them between batches (the tables' clock, expiry, the checkpoint, the figures)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import TracebackType
from typing import Any

import numpy as np

from pipeline.train import shard_process
from pipeline.train.ps.row_server import RowServer, answer_driver
from pipeline.train.ps.rows import SHARED, RowSpec, shard_of


def specs_of(schema: Any, seed: int) -> list[RowSpec]:
    """The tables a schema's ID features name, in the order first named.

    >>> from pipeline.table.schema import Feature, TableSchema
    >>> s = TableSchema((Feature("clicked", "id", dim=4, table="item"),
    ...     Feature("shown", "id", dim=4, table="item"), Feature("user", "id", dim=8)), None)
    >>> [(t.name, t.dim) for t in specs_of(s, seed=1)]
    [('item', 4), ('user', 8)]
    """
    specs: dict[str, RowSpec] = {}
    for f in schema.ids:
        name = f.table or f.name
        specs.setdefault(
            name,
            RowSpec(
                name,
                dim=f.dim,
                min_count=f.min_count,
                ttl=f.ttl,
                learning_rate=f.learning_rate,
                optimizer=f.optimizer,
                seed=seed,
            ),
        )
    return list(specs.values())


class RowServers:
    """The row servers of a run's tables, one per shard.

    Args:
        specs: the tables.
        secret: the run's secret (the parameter server's).
        host: where they listen (the parameter server's host).
        shards: how many.
        on_request: called with ``"rows"`` and its seconds after each answered request (in
            processes: for each request answered since, at each :meth:`stats`).
        processes: each shard in a process of its own (the driver's run: workers' requests
            then never wait behind the driver's threads), else in this one (the model
            server's, tests).
    """

    def __init__(
        self,
        specs: list[RowSpec],
        *,
        secret: bytes,
        host: str,
        shards: int = 1,
        on_request: Callable[[str, float], None] | None = None,
        processes: bool = False,
    ) -> None:
        self.specs, self.shards, self.host = specs, shards, host
        self._on_request = on_request
        self._now = 0
        #: The shards in this process (none where they run in processes of their own).
        self.servers: list[RowServer] = []
        self._children: shard_process.Children | None = None
        self._ports: list[int] = []
        if processes:
            jobs = [
                {
                    "kind": "rows",
                    "specs": [dataclasses.asdict(spec) for spec in specs],
                    "secret": secret,
                    "host": host,
                    "shard": s,
                    "shards": shards,
                }
                for s in range(shards)
            ]
            self._children = shard_process.Children(jobs, "Row-server shard")
        else:
            self.servers = [
                RowServer(
                    specs, secret=secret, host=host, shard=s, shards=shards, on_request=on_request
                )
                for s in range(shards)
            ]

    @property
    def addresses(self) -> list[tuple[str, int]]:
        if self._children is not None:
            return [(self.host, port) for port in self._ports]
        return [s.address for s in self.servers]

    @property
    def dims(self) -> list[int]:
        return [s.dim for s in self.specs]

    @property
    def now(self) -> int:
        """Records trained before the batch under way (the tables' clock for ``ttl``)."""
        return self._now

    def start(self) -> RowServers:
        if self._children is not None:
            self._ports = self._children.start()
        for s in self.servers:
            s.start()
        return self

    def stop(self) -> None:
        if self._children is not None:
            self._children.stop()
        for s in self.servers:
            s.stop()

    def __enter__(self) -> RowServers:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _each(self, op: str, args: list[Any] | None = None) -> list[Any]:
        """Every shard's answer to the driver's request ``op`` (``args[s]`` to shard ``s``)."""
        if self._children is not None:
            return self._children.ask(op, args)
        each = args if args is not None else [None] * len(self.servers)
        return [answer_driver(s, op, a) for s, a in zip(self.servers, each, strict=True)]

    def advance(self, records: int) -> int:
        """A batch of ``records`` is trained: every shard's clock moves on, old rows go."""
        dropped = sum(self._each("advance", [records] * self.shards))
        self._now += records
        return dropped

    def changes(self, *, snapshot: bool) -> list[list[dict[str, Any]]]:
        """Per shard, per table: the rows changed since the last call, or all of them."""
        return self._each("changes", [snapshot] * self.shards)

    def load(self, changes: list[list[dict[str, Any]]], *, now: int) -> None:
        self._each("load", [(change, now) for change in changes])
        self._now = now

    def table_rows(self, t: int) -> dict[str, np.ndarray]:
        """Table ``t``'s rows over every shard, as one table holds them (the shared row is
        the owning shard's), sorted by key: ``keys``, ``values``, ``accum``, ``last_seen``."""
        owner = int(shard_of(np.array([SHARED], np.uint64), self.shards)[0])
        parts = []
        for s, rows in enumerate(self._each("rows", [t] * self.shards)):
            if s != owner:
                keep = rows["keys"] != SHARED
                rows = {k: v[keep] for k, v in rows.items()}
            parts.append(rows)
        merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        order = np.argsort(merged["keys"], kind="stable")
        return {k: v[order] for k, v in merged.items()}

    def stats(self) -> dict[str, Any]:
        """The tables' rows, bytes, rows created and expired, summed over the shards; rows
        read and pushed; the row pushes' staleness."""
        each = self._each("stats")
        if self._on_request is not None:  # the requests shard processes answered since
            for seconds in (d for one in each for d in one.pop("durations", ())):
                self._on_request("rows", seconds)
        tables: dict[str, dict[str, int]] = {}
        for one in each:
            for name, t in one["tables"].items():
                mine = tables.setdefault(name, dict.fromkeys(t, 0))
                for k, v in t.items():
                    mine[k] += v
        staleness: dict[str, int] = {}
        for one in each:
            for k, v in one["staleness"].items():
                staleness[k] = staleness.get(k, 0) + v
        return {
            "tables": tables,
            "rows_read": sum(o["rows_read"] for o in each),
            "rows_pushed": sum(o["rows_pushed"] for o in each),
            "repeats_dropped": sum(o["repeats_dropped"] for o in each),
            "staleness": staleness,
            "now": self.now,
        }
