"""An ID model's rows in partition training: read before each mini-batch, pushed after it.

For each mini-batch the worker reads the rows of the batch's unique IDs (one request per
row-server shard, the previous step's push riding along), gives the model its input (the
other columns, then the rows), and after the step scatters the input's gradient back to
those rows. Each push names the task and its step, so the row servers apply it once
however often Spark runs the task; before each exchange of the dense weights the pending
push goes on its own, so that the servers never hold fewer of a task's steps than the
parameter server (a retried task skips exactly those).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.table.ids import IdLayout
from pipeline.train.ps.row_client import Push, RowClient


class IdRows:
    """One task's rows: ``before`` each step (its model input), ``after`` it (its push).

    Args:
        layout: where the schema's IDs are (:class:`~pipeline.table.ids.IdLayout`).
        client: the connections to the row servers.
        task: the task's key (0: pushes name none).
    """

    def __init__(self, layout: IdLayout, client: RowClient, task: int = 0) -> None:
        self.layout, self.client, self.task = layout, client, task
        self.tables = list(layout.tables())
        self._table_of = [self.tables.index(c.table) for c in layout.columns]
        self._pending: tuple[int, list[Push]] | None = None
        self._read: tuple[list[np.ndarray], list[np.ndarray]] | None = None

    def before(self, x: np.ndarray) -> np.ndarray:
        """The model's input for mini-batch ``x`` (its keys' rows read now)."""
        keys = self.layout.keys(x)
        uniques, inverses = [], []
        for t in range(len(self.tables)):
            mine = [k for k, owner in zip(keys, self._table_of, strict=True) if owner == t]
            unique, inverse = np.unique(np.concatenate(mine), return_inverse=True)
            uniques.append(unique)
            inverses.append(inverse)
        step, push = self._pending or (0, None)
        self._pending = None
        got = self.client.exchange(uniques, push, task=self.task, exchange=step)
        rows, has_rows = [], []
        at = [0] * len(self.tables)
        for k, t in zip(keys, self._table_of, strict=True):
            idx = inverses[t][at[t] : at[t] + len(k)]
            at[t] += len(k)
            rows.append(got[t][0][idx])
            has_rows.append(got[t][1][idx])
        self._read = (keys, has_rows)
        return self.layout.assemble(x, rows)

    def after(self, step: int, input_grad: np.ndarray | None) -> None:
        """Keep step ``step``'s push (its rows' gradients, its IDs' sightings) for the next
        request."""
        assert self._read is not None and input_grad is not None
        keys, has_rows = self._read
        grads = self.layout.row_gradients(np.asarray(input_grad, np.float32))
        push: list[Push] = []
        for t in range(len(self.tables)):
            mine = [i for i, owner in enumerate(self._table_of) if owner == t]
            push.append(
                (
                    np.concatenate([keys[i] for i in mine]),
                    np.concatenate([grads[i] for i in mine]),
                    np.concatenate([has_rows[i] for i in mine]),
                )
            )
        self._pending, self._read = (step, push), None

    def flush(self) -> None:
        """Send the pending push on its own (before an exchange of the dense weights)."""
        if self._pending is not None:
            step, push = self._pending
            self._pending = None
            self.client.push(push, task=self.task, exchange=step)

    def figures(self) -> dict[str, Any]:
        """What the task's rows did: rows read and pushed, the pushes' staleness."""
        c = self.client
        return {"rows_read": c.rows_read, "rows_pushed": c.rows_pushed, "staleness": c.staleness}


def model_input(
    layout: IdLayout, client: RowClient, x: np.ndarray, *, chunk: int = 4096
) -> tuple[np.ndarray, int]:
    """The model's input for ``x`` with its rows read (nothing pushed): what scoring and
    serving see; and how many of its IDs have no row of their own (they read the shared
    row; a missing ID is not counted)."""
    from pipeline.table.ids import GAP

    parts, unknown = [], 0
    tables = list(layout.tables())
    owner = [tables.index(c.table) for c in layout.columns]
    for start in range(0, len(x), chunk):
        part = x[start : start + chunk]
        keys = layout.keys(part)
        reads = [
            np.unique(np.concatenate([k for k, o in zip(keys, owner, strict=True) if o == t]))
            for t in range(len(tables))
        ]
        got = client.exchange(reads)
        rows = []
        for k, t in zip(keys, owner, strict=True):
            at = np.searchsorted(reads[t], k)
            rows.append(got[t][0][at])
            unknown += int((~got[t][1][at] & (k != GAP)).sum())
        parts.append(layout.assemble(part, rows))
    out = np.concatenate(parts) if parts else np.zeros((0, layout.width), np.float32)
    return out, unknown
