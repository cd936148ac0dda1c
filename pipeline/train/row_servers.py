"""A run's ID tables on the driver: one row server per ``--ps-shards``, and what the driver
does with them between batches (the tables' clock, expiry, the checkpoint, the figures)."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

import numpy as np

from pipeline.train.ps.row_server import RowServer
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
        on_request: called with ``"rows"`` and its seconds after each answered request.
    """

    def __init__(
        self,
        specs: list[RowSpec],
        *,
        secret: bytes,
        host: str,
        shards: int = 1,
        on_request: Callable[[str, float], None] | None = None,
    ) -> None:
        self.specs = specs
        self.servers = [
            RowServer(
                specs, secret=secret, host=host, shard=s, shards=shards, on_request=on_request
            )
            for s in range(shards)
        ]

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [s.address for s in self.servers]

    @property
    def dims(self) -> list[int]:
        return [s.dim for s in self.specs]

    @property
    def now(self) -> int:
        """Records trained before the batch under way (the tables' clock for ``ttl``)."""
        return self.servers[0].now

    def start(self) -> RowServers:
        for s in self.servers:
            s.start()
        return self

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def __enter__(self) -> RowServers:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def advance(self, records: int) -> int:
        """A batch of ``records`` is trained: every shard's clock moves on, old rows go."""
        return sum(s.advance(records) for s in self.servers)

    def changes(self, *, snapshot: bool) -> list[list[dict[str, Any]]]:
        """Per shard, per table: the rows changed since the last call, or all of them."""
        return [s.changes(snapshot=snapshot) for s in self.servers]

    def load(self, changes: list[list[dict[str, Any]]], *, now: int) -> None:
        for server, change in zip(self.servers, changes, strict=True):
            server.load(change, now=now)

    def table_rows(self, t: int) -> dict[str, np.ndarray]:
        """Table ``t``'s rows over every shard, as one table holds them (the shared row is
        the owning shard's), sorted by key: ``keys``, ``values``, ``accum``, ``last_seen``."""
        owner = int(shard_of(np.array([SHARED], np.uint64), len(self.servers))[0])
        parts = []
        for s, server in enumerate(self.servers):
            rows = server.tables[t].rows()
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
        each = [s.stats() for s in self.servers]
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
