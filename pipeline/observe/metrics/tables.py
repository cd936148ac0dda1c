"""Metrics of a run's ID tables (the rows on the row servers), on the training driver's
registry: what an operator of a recommender watches (rows per table and their bytes, rows
created and expired, rows read and pushed, the row pushes' staleness).

Every counter is this process's (it starts at 0 with each trainer), so ``rate()`` reads
right across a restart (see :class:`~pipeline.observe.metrics.TrainingMetrics`).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pipeline.observe import buckets


class TableMeters:
    """The ID tables' metrics, registered on ``registry``; :meth:`on_batch` feeds them."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.rows = Gauge(
            "streamtrain_id_table_rows", "Rows of IDs in each table.", ["table"], registry=registry
        )
        self.bytes = Gauge(
            "streamtrain_id_table_bytes",
            "Each table's memory on the row servers (rows, optimizer state, maps).",
            ["table"],
            registry=registry,
        )
        self.created = Counter(
            "streamtrain_id_rows_created_total",
            "Rows created (an ID seen min_count times).",
            ["table"],
            registry=registry,
        )
        self.expired = Counter(
            "streamtrain_id_rows_expired_total",
            "Rows dropped (not seen for ttl records).",
            ["table"],
            registry=registry,
        )
        self.moved = Counter(
            "streamtrain_id_rows_moved_total",
            "Rows the workers read from, and pushed to, the row servers.",
            ["direction"],
            registry=registry,
        )
        self.staleness = Histogram(
            "streamtrain_id_row_staleness",
            "Row pushes of other workers between a worker's read of its rows and its push.",
            registry=registry,
            buckets=buckets.INTEGER,
        )
        self._seen: dict[tuple[str, str], int] = {}

    def on_batch(self, tables: Any, results: list[Any]) -> None:
        """A batch's ``BatchRow.tables`` (:class:`~pipeline.train.rows.TableFigures`, or None)
        and its task results."""
        if tables is None:
            return
        self.moved.labels("read").inc(tables.rows_read)
        self.moved.labels("pushed").inc(tables.rows_pushed)
        for r in results:
            for s in getattr(r, "row_staleness", ()):
                self.staleness.observe(s)
        for name, t in tables.sizes.items():
            self.rows.labels(name).set(t.rows)
            self.bytes.labels(name).set(t.bytes)
            for key, counter in (("created", self.created), ("expired", self.expired)):
                now = getattr(t, key)
                counter.labels(name).inc(max(0, now - self._seen.get((name, key), 0)))
                self._seen[name, key] = now
