"""One table cut into shards by key, driven in one process: the reference of what the row
servers and their client do over the network (:mod:`pipeline.train.ps.row_client`)."""

from __future__ import annotations

import numpy as np

from pipeline.train.ps.rows import SHARED, RowSpec, RowTable, shard_of


class ShardedRows:
    """One table cut into shards by key (:func:`shard_of`), driven as a worker drives it: the
    reference of what the networked client does. An ID without a row reads, and trains, the
    shared row of the shard that owns :data:`SHARED`; so any number of shards holds exactly
    the rows, and the shared row, that one table would.

    Example:
        >>> spec = RowSpec("user", dim=2, min_count=1)
        >>> one, two = ShardedRows(spec, 1), ShardedRows(spec, 2)
        >>> keys = np.array([1, 2, 3, 1], dtype=np.uint64)
        >>> for t in (one, two):
        ...     for now in (1, 2):
        ...         _, has_row = t.read(keys)
        ...         _ = t.push(keys, np.full((4, 2), 0.5, np.float32), has_row, now=now)
        >>> all(np.array_equal(one.rows()[k], two.rows()[k]) for k in one.rows())
        True
    """

    def __init__(self, spec: RowSpec, shards: int) -> None:
        self.shards = [RowTable(spec) for _ in range(shards)]
        self._owner = int(shard_of(np.array([SHARED], np.uint64), shards)[0])

    def read(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keys = np.asarray(keys, np.uint64)
        where = shard_of(keys, len(self.shards))
        values = np.empty((len(keys), self.shards[0].spec.dim), np.float32)
        has_row = np.zeros(len(keys), bool)
        for s, table in enumerate(self.shards):
            mine = where == s
            if mine.any():
                values[mine], has_row[mine] = table.read(keys[mine])
        shared = self.shards[self._owner].read(np.array([SHARED], np.uint64))[0][0]
        values[~has_row] = shared
        return values, has_row

    def push(
        self, keys: np.ndarray, gradients: np.ndarray, has_row: np.ndarray, *, now: int
    ) -> int:
        """One exchange's push: each key's gradient to its row, or to the shared row where
        the read found none; then every key's sighting. Returns the rows created."""
        keys = np.asarray(keys, np.uint64)
        rowed = np.where(has_row, keys, SHARED)
        where = shard_of(rowed, len(self.shards))
        for s, table in enumerate(self.shards):
            if (where == s).any():
                table.push(rowed[where == s], np.asarray(gradients)[where == s], now=now)
        unique, counts = np.unique(keys, return_counts=True)
        at = shard_of(unique, len(self.shards))
        return sum(
            table.sight(unique[at == s], counts[at == s], now=now)
            for s, table in enumerate(self.shards)
        )

    def expire(self, *, now: int) -> int:
        return sum(table.expire(now=now) for table in self.shards)

    def __len__(self) -> int:
        return sum(len(table) for table in self.shards)

    def rows(self) -> dict[str, np.ndarray]:
        """Every row, the owner's shared row among them, sorted by key."""
        parts = [
            t.rows() if s == self._owner else _without_shared(t.rows())
            for s, t in enumerate(self.shards)
        ]
        merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        order = np.argsort(merged["keys"], kind="stable")
        return {k: v[order] for k, v in merged.items()}


def _without_shared(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    keep = rows["keys"] != SHARED
    return {k: v[keep] for k, v in rows.items()}
