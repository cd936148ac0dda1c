"""An ID model's rows in partition training: read before each mini-batch, pushed after it.

For each mini-batch the worker gives the model its input (the other columns, then the rows
of the batch's IDs) and after the step scatters the input's gradient back to those rows:
one request per row-server shard carries the step's push and reads the next mini-batch's
rows. Each push names the task and its step, so the row servers apply it once however
often Spark runs the task. It is sent before the step's exchange of the dense weights and
its reply taken after it, so that both servers work at once; a retried task starts after
the last step both hold (the row servers may hold one step fewer than the parameter server,
where an attempt died with its rows in flight), and the pushes of steps one of them already
holds are dropped there as repeats.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from pipeline.table.ids import IdLayout
from pipeline.train.ps.row_client import RowClient, grouped

#: A mini-batch's keys: per ID feature, each record's; per table, the unique keys of its
#: features' records and each record's place among them.
_Keys = tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]


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
        # The step under way: its keys, and per table whether each unique key had a row.
        self._read: tuple[_Keys, list[np.ndarray]] | None = None
        # The next step's keys and rows, as the last reply brought them.
        self._next: tuple[_Keys, list[Any]] | None = None
        # The request in flight: the following mini-batch's keys.
        self._following: _Keys | None = None
        self.seconds = 0.0  # in the row servers' requests

    def _reads(self, x: np.ndarray) -> _Keys:
        """``x``'s keys per feature, and per table its unique keys and where each key is."""
        keys = self.layout.keys(x)
        uniques, inverses = [], []
        for mine in self._features:
            together = np.concatenate([keys[i] for i in mine])
            unique, inverse = np.unique(together, return_inverse=True)
            uniques.append(unique)
            inverses.append(inverse)
        return keys, uniques, inverses

    def _rows(self, batch: _Keys, got: list[Any]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Each feature's rows and whether each record's ID had a row of its own, from the
        reply ``got`` (per table: its unique keys' rows, and whether each had one)."""
        keys, _, inverses = batch
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
            batch, got = self._next
            self._next = None
        else:
            batch = self._reads(x)
            started = time.perf_counter()
            got = self.client.exchange(batch[1])
            self.seconds += time.perf_counter() - started
        self._read = (batch, [has_row for _, has_row in got])
        return self.layout.assemble(x, self._rows(batch, got)[0])

    def after(self, step: int, input_grad: np.ndarray | None, following: np.ndarray | None) -> None:
        """Send step ``step``'s rows' gradients and its IDs' sightings, asking in the same
        request for the rows of the ``following`` mini-batch (None: the task's last step);
        :meth:`arrive` takes the reply. The worker exchanges its dense weights in between:
        the two servers work at once, and a retried task levels them (:meth:`level`)."""
        assert self._read is not None and input_grad is not None
        (_, uniques, inverses), owned = self._read
        self._read = None
        # The step's loss is the mini-batch's mean, so a row's share of its gradient shrinks
        # with the records of other IDs beside it; scaled back by the records, each row
        # learns from the sum over its own records, whatever the mini-batch's size.
        grads = self.layout.row_gradients(np.asarray(input_grad, np.float32) * len(input_grad))
        push = [
            grouped(uniques[t], inverses[t], owned[t], np.concatenate([grads[i] for i in mine]))
            for t, mine in enumerate(self._features)
        ]
        started = time.perf_counter()
        self._following = self._reads(following) if following is not None else None
        reads = self._following[1] if self._following is not None else None
        self.client.send(reads, push, task=self.task, exchange=step)
        self.seconds += time.perf_counter() - started

    def arrive(self) -> None:
        """Take the reply to :meth:`after`'s request: its push applied, the next mini-batch's
        rows read."""
        started = time.perf_counter()
        got = self.client.receive()
        self.seconds += time.perf_counter() - started
        if self._following is not None:
            self._next = (self._following, got)
        self._following = None

    def level(self, dense: Any, done: int, window: int, steps: int) -> int:
        """The exchanges an earlier attempt of the task left applied on both servers, given
        the parameter server's ``done`` (one every ``window`` of the task's ``steps``, and
        one after the last) and its client ``dense``. A step's rows go out before its
        exchange, but an attempt that died with them in flight may have had the exchange
        applied and not the rows: the retry then goes back to the rows' last exchange, and
        its pushes the parameter server already holds are dropped there as repeats."""
        if not done or not self.task:
            return done
        rows = self.client.applied(self.task)
        if rows >= min(done * window, steps):
            return done
        dense.continue_after(rows // window)
        return rows // window

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
        batch = reader._reads(part)
        keys = batch[0]
        rows, has_rows = reader._rows(batch, client.exchange(batch[1]))
        unknown += sum(int((~h & (k != GAP)).sum()) for k, h in zip(keys, has_rows, strict=True))
        parts.append(layout.assemble(part, rows))
    out = np.concatenate(parts) if parts else np.zeros((0, layout.width), np.float32)
    return out, unknown
