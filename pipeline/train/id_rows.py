"""An ID model's rows in partition training: read before each mini-batch, pushed after it.

For each mini-batch the worker gives the model its input (the other columns, then the rows
of the batch's IDs) and after the step scatters the input's gradient back to those rows:
one request per row-server shard carries the step's push and reads the next mini-batch's
rows. Each push names the task and its step, so the row servers apply it once however
often Spark runs the task; it goes before the step's exchange of the dense weights, so that
the servers never hold fewer of a task's steps than the parameter server (a retried task
skips exactly those).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from pipeline.table.ids import IdLayout
from pipeline.train.ps.row_client import Push, RowClient


class IdRows:
    """One task's rows: ``before`` each step (its model input), ``after`` it (its push, with
    the next step's read in the same request).

    Args:
        layout: where the schema's IDs are (:class:`~pipeline.table.ids.IdLayout`).
        client: the connections to the row servers.
        task: the task's key (0: pushes name none).
    """

    def __init__(self, layout: IdLayout, client: RowClient, task: int = 0) -> None:
        self.layout, self.client, self.task = layout, client, task
        self.tables = list(layout.tables())
        self._table_of = [self.tables.index(c.table) for c in layout.columns]
        # Per table, the ID features whose keys it holds.
        self._features = [
            [i for i, owner in enumerate(self._table_of) if owner == t]
            for t in range(len(self.tables))
        ]
        # The step under way: its keys and, per feature, which had a row of their own.
        self._read: tuple[list[np.ndarray], list[np.ndarray]] | None = None
        self._next: tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]] | None = None
        self.seconds = 0.0  # in the row servers' requests

    def _reads(self, x: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        """``x``'s keys per feature, and per table its unique keys and where each key is."""
        keys = self.layout.keys(x)
        uniques, inverses = [], []
        for mine in self._features:
            together = np.concatenate([keys[i] for i in mine])
            unique, inverse = np.unique(together, return_inverse=True)
            uniques.append(unique)
            inverses.append(inverse)
        return keys, uniques, inverses

    def _rows(
        self, keys: list[np.ndarray], inverses: list[np.ndarray], got: list[Any]
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        rows, has_rows = [], []
        at = [0] * len(self.tables)
        for k, t in zip(keys, self._table_of, strict=True):
            idx = inverses[t][at[t] : at[t] + len(k)]
            at[t] += len(k)
            rows.append(got[t][0][idx])
            has_rows.append(got[t][1][idx])
        return rows, has_rows

    def before(self, x: np.ndarray) -> np.ndarray:
        """The model's input for mini-batch ``x`` (its rows as the last push's reply brought
        them, or read now)."""
        if self._next is not None:
            keys, rows, has_rows = self._next
            self._next = None
        else:
            keys, uniques, inverses = self._reads(x)
            started = time.perf_counter()
            rows, has_rows = self._rows(keys, inverses, self.client.exchange(uniques))
            self.seconds += time.perf_counter() - started
        self._read = (keys, has_rows)
        return self.layout.assemble(x, rows)

    def after(self, step: int, input_grad: np.ndarray | None, following: np.ndarray | None) -> None:
        """Push step ``step``'s rows' gradients and its IDs' sightings, reading the rows of
        the ``following`` mini-batch in the same request (None: the task's last step)."""
        assert self._read is not None and input_grad is not None
        keys, has_rows = self._read
        self._read = None
        # The step's loss is the mini-batch's mean, so a row's share of its gradient shrinks
        # with the records of other IDs beside it; scaled back by the records, each row
        # learns from the sum over its own records, whatever the mini-batch's size.
        grads = self.layout.row_gradients(np.asarray(input_grad, np.float32) * len(input_grad))
        push: list[Push] = []
        for mine in self._features:
            push.append(
                (
                    np.concatenate([keys[i] for i in mine]),
                    np.concatenate([grads[i] for i in mine]),
                    np.concatenate([has_rows[i] for i in mine]),
                )
            )
        started = time.perf_counter()
        if following is None:
            self.client.push(push, task=self.task, exchange=step)
            self.seconds += time.perf_counter() - started
            return
        nkeys, uniques, inverses = self._reads(following)
        got = self.client.exchange(uniques, push, task=self.task, exchange=step)
        self.seconds += time.perf_counter() - started
        self._next = (nkeys, *self._rows(nkeys, inverses, got))

    def figures(self) -> dict[str, Any]:
        """What the task's rows did: rows read and pushed, the pushes' staleness."""
        c = self.client
        return {
            "rows_read": c.rows_read,
            "rows_pushed": c.rows_pushed,
            "staleness": c.staleness,
            "seconds": self.seconds,
        }


def model_input(
    layout: IdLayout, client: RowClient, x: np.ndarray, *, chunk: int = 4096
) -> tuple[np.ndarray, int]:
    """The model's input for ``x`` with its rows read (nothing pushed): what scoring and
    serving see; and how many of its IDs have no row of their own (they read the shared
    row; a missing ID is not counted)."""
    from pipeline.table.ids import GAP

    reader = IdRows(layout, client)
    parts, unknown = [], 0
    for start in range(0, len(x), chunk):
        part = x[start : start + chunk]
        keys, uniques, inverses = reader._reads(part)
        rows, has_rows = reader._rows(keys, inverses, client.exchange(uniques))
        unknown += sum(int((~h & (k != GAP)).sum()) for k, h in zip(keys, has_rows, strict=True))
        parts.append(layout.assemble(part, rows))
    out = np.concatenate(parts) if parts else np.zeros((0, layout.width), np.float32)
    return out, unknown
