"""The driver's half of exactly-once training, one micro-batch at a time.

Spark replays a failed micro-batch with the same id and offsets, and on a cluster retries
single tasks. Per batch, on the driver, :class:`TrainDriver`:

1. skips a batch the checkpoint already holds (after checking that Spark replays it over
   the ranges the checkpoint applied under that id: :func:`~pipeline.train.ledger.check_replay`);
2. checks each task's mini-batches against the parameter server's own count of those it
   applied; a difference stops the run before the batch is committed, and so does a model
   that diverged (a NaN loss, weights not finite) or whose held-out score collapsed
   (:mod:`~pipeline.train.divergence`: checked as the batch is scored, after its save;
   :mod:`~pipeline.train.divergence_stop` says so, and names the way back);
3. saves the center, the clock, the rule's state, the batch id and the trained ranges in
   one atomic write (:mod:`~pipeline.train.checkpoint`), before Spark commits the batch;
4. releases the trained records (a broker that can delete them), and hands the batch's
   row on.

A save that fails raises before the commit, so the batch is replayed. The batch
:class:`~pipeline.jobs.trainer.Trainer` keeps no checkpoint and uses step 2 alone
(:meth:`TrainDriver.check_applied`).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import StreamtrainError
from pipeline.ingest.batch_figures import BatchFigures
from pipeline.ingest.kafka.release import Releaser
from pipeline.ingest.offsets import OffsetRange
from pipeline.train import checkpoint, divergence_stop, ledger, table_store
from pipeline.train.adapt import DriftResponse
from pipeline.train.divergence import HeldoutWatch
from pipeline.train.freshness import Freshness
from pipeline.train.partition import TaskResult
from pipeline.train.rows import BatchRow, TableFigures, TableSize, TaskRow
from pipeline.train.server import Server

#: Called with each saved batch's figures, its row and the center weights it saved.
OnRow = Callable[[BatchFigures, BatchRow, np.ndarray], None]


def applied_steps(server: Server, result: TaskResult) -> int:
    """The mini-batches of ``result``'s task that ``server`` applied, by its own count (a
    task Spark ran twice is counted once); for a result that named no task, the worker's."""
    return server.applied(result.task)[1] if result.task else result.steps


class TrainDriver:
    """Drives the exactly-once protocol of a run's micro-batches on the driver.

    Args:
        server: the run's parameter server (one, or the facade of its shards).
        state: what the checkpoint holds (a resumed run's, or a fresh one); updated per batch.
            None: no checkpoint (the batch Trainer, which only checks its tasks).
        folder: where the checkpoint is written.
        releaser: deletes the records of batches Spark committed (the run's own noida broker).
        sync_slots: with a synchronous algorithm, the tasks that can run at once (Spark's
            task slots): a round waits for at most this many. 0: asynchronous.
        started: ``time.monotonic()`` when the run started (each row's ``t`` counts from it).
        fault: tests only, ``<point>:<batch id>``: SIGKILL this process there (see :func:`_fault`).
        on_row: called after each batch is saved (see :data:`OnRow`).
        on_skip: called for each batch skipped as already applied.
        keep: checkpoint generations kept (``--keep-checkpoints``).
    """

    def __init__(
        self,
        server: Server,
        state: checkpoint.State | None = None,
        *,
        folder: Path | None = None,
        releaser: Releaser | None = None,
        sync_slots: int = 0,
        started: float | None = None,
        fault: str | None = None,
        on_row: OnRow | None = None,
        on_skip: Callable[[int], None] | None = None,
        keep: int = checkpoint.KEEP,
    ) -> None:
        self.server, self.state, self.folder, self.releaser = server, state, folder, releaser
        self.sync_slots = sync_slots
        self.started = time.monotonic() if started is None else started
        self.fault = fault
        self.on_row, self.on_skip = on_row, on_skip
        self.keep = keep
        self._batch = -1
        #: Watches the held-out scores for a collapse (see :meth:`watch_heldout`).
        self.watch: HeldoutWatch | None = None
        #: The drift signals and the run's reaction (:meth:`watch_drift`).
        self.drift: DriftResponse | None = None
        #: The run's ID tables (:class:`~pipeline.train.row_servers.RowServers`), if any.
        self.rows: Any = None
        #: The newest data the center holds, per partition (a resumed run's from its checkpoint).
        self.freshness = Freshness.from_state(
            state.extra.get("freshness") if state is not None else None
        )

    def watch_heldout(self, y: np.ndarray, *, regression: bool) -> None:
        """Stop the run when its held-out score (on labels ``y``) collapses
        (:meth:`check_heldout`), going on from what the checkpoint recorded of the scores."""
        self.watch = HeldoutWatch.for_labels(y, regression=regression)
        self.watch.restore(self.state.extra.get("heldout") if self.state is not None else None)

    def watch_drift(self, response: DriftResponse) -> None:
        """Find drifts in each batch and react (:class:`~pipeline.train.adapt.DriftResponse`)."""
        self.drift = response

    @property
    def trained(self) -> int:
        """Records the checkpoint says the run trained, across resumes."""
        return int(self.state.extra.get("trained", 0)) if self.state is not None else 0

    @property
    def handled(self) -> int:
        """Records trained, and held out of training after a drift, across resumes."""
        return self.trained + (
            int(self.state.extra.get("held_out", 0)) if self.state is not None else 0
        )

    def skip(self, batch_id: int, ranges: list[OffsetRange] | None) -> bool:
        """Whether ``batch_id`` is one the checkpoint holds (Spark replays it after a lost
        commit); ``ranges``: the batch's merged ranges as Spark logged them (None: unknown)."""
        self._batch = batch_id
        self._fault(
            "committed", batch_id - 1
        )  # Spark committed the previous batch and asks for this one
        state = self.state
        if state is None or batch_id > state.last_batch_id:
            return False
        ledger.check_replay(
            state.ledger,
            batch_id=batch_id,
            last_batch_id=state.last_batch_id,
            ranges=ranges,
            where=str(self.folder),
        )
        if self.on_skip is not None:
            self.on_skip(batch_id)
        return True

    def on_tasks(self, n: int) -> None:
        """``n`` tasks are about to train the batch."""
        self._fault("batch", self._batch)  # inside the batch, before its state is saved
        # Synchronous rounds wait for the tasks that run at once: at most one per slot.
        if self.sync_slots:
            self.server.expect_workers(min(n, self.sync_slots))

    def on_batch(self, info: BatchFigures) -> None:
        """The batch's tasks are done: check, save (before Spark commits it), release, report."""
        assert self.state is not None and self.folder is not None
        committing = time.perf_counter()
        weights, clock, optimizer = self.server.checkpoint()
        row = BatchRow.from_batch(info, t=time.monotonic() - self.started, clock=clock)
        row.tasks = self._check_tasks(info.batch_id, info.results)
        self.check_finite(info.batch_id, weights, row)
        if (
            self.drift is not None
        ):  # before the save: the checkpoint holds the drifts and the held-out count
            replay = self.drift.on_batch(info, row, self)
            if replay:  # the batch trained again after a drift: checked, and what it trained saved
                self._check_tasks(info.batch_id, replay)
                weights, clock, optimizer = self.server.checkpoint()
                row.clock = clock
                self.check_finite(info.batch_id, weights, row)
        began = time.perf_counter()
        state = self.state
        state.weights, state.clock, state.last_batch_id, state.optimizer = (
            weights,
            clock,
            info.batch_id,
            optimizer,
        )
        state.ledger = ledger.add(state.ledger, info.batch_id, info.ranges)
        # The batches passed over as unreadable (--on-poison skip) stay with the checkpoint:
        # their offsets are accounted for, as skipped, across resumes.
        poison = list(state.extra.get("poison", [])) + [
            [info.batch_id, p.topic, p.partition, p.first, p.last, p.cause] for p in info.poison
        ]
        self.freshness.learn(info.newest_ms, lag=info.lag)
        held_out = int(state.extra.get("held_out", 0)) + row.held_out
        tables = state.extra.get("tables")
        if self.rows is not None:  # the rows' clock, their expiry, their changes beside the save
            expired = self.rows.advance(row.trained)
            tables = table_store.save(self.folder, info.batch_id, self.rows, tables)
            row.tables = row.tables or TableFigures()
            row.tables.expired = expired
            row.tables.sizes = {
                name: TableSize(**t) for name, t in self.rows.stats()["tables"].items()
            }
        state.extra = {
            "trained": self.trained + row.trained,
            **({"poison": poison} if poison else {}),
            "freshness": self.freshness.state(),
            **({"tables": tables} if tables else {}),
            **({"heldout": self.watch.state()} if self.watch is not None else {}),
            **(
                {
                    "drift": self.drift.watch.state(),
                    "adapt": self.drift.state(),
                    "held_out": held_out,
                }
                if self.drift is not None
                else {}
            ),
        }
        # The generation of the best score stays, however old, for a collapse to go back to;
        # so does each from just before a drift.
        pinned = [self.watch.best_batch] if self.watch is not None else []
        checkpoint.save(
            self.folder,
            state,
            keep=self.keep,
            pinned=pinned + (self.drift.pinned() if self.drift is not None else []),
        )
        row.checkpoint_ms = round((time.perf_counter() - began) * 1000, 2)
        if self.releaser is not None:
            self.releaser.trained(info.ranges)
        row.commit_s = round(time.perf_counter() - committing, 4)
        row.freshness_s = self.freshness.seconds(
            time.time()
        )  # the moment the batch is saved (and served)
        row.data_as_of = self.freshness.as_of
        if self.on_row is not None:
            self.on_row(info, row, weights)  # scores the held-out split when due
        if row.heldout:
            self.check_heldout(info.batch_id, row.heldout)
        self._fault("saved", info.batch_id)  # saved, and Spark has not committed it

    def _check_tasks(self, batch_id: int, results: list[TaskResult]) -> list[TaskRow]:
        """Stop where the server refused a task's update as not finite (its model diverged),
        then check every task against the server (:meth:`check_applied`)."""
        diverged = [why for r in results if (why := getattr(r, "diverged", None))]
        if diverged:
            divergence_stop.diverged(batch_id, diverged[0], folder=self.folder)
        return self.check_applied(results, batch_id=batch_id)

    def check_finite(self, batch_id: int, weights: np.ndarray, row: BatchRow) -> None:
        """Stop a model that diverged before its weights are saved or served
        (:func:`~pipeline.train.divergence_stop.check_finite`)."""
        divergence_stop.check_finite(batch_id, weights, row, watch=self.watch, folder=self.folder)

    def check_heldout(self, batch_id: int, scores: dict[str, float]) -> None:
        """Stop a model whose held-out score collapsed, before Spark commits the batch
        (:func:`~pipeline.train.divergence_stop.check_heldout`)."""
        divergence_stop.check_heldout(batch_id, scores, watch=self.watch, folder=self.folder)

    def check_applied(
        self, results: list[TaskResult], *, batch_id: int | None = None
    ) -> list[TaskRow]:
        """Each task's mini-batches against the parameter server's own count of those it
        applied; a difference (an update applied twice, or lost) raises, so that the batch
        is not committed and a resume trains it again from the last checkpoint.

        Args:
            results: the tasks' results.
            batch_id: the micro-batch they trained (None: a batch Trainer's one call).
        """
        rows = []
        for r in results:
            applied = applied_steps(self.server, r)
            rows.append(TaskRow.of(r, applied=applied))
            if applied == r.steps_total:
                continue
            if batch_id is None:
                raise StreamtrainError(
                    f"The parameter server applied {applied} of the {r.steps_total} "
                    f"mini-batches of worker {r.worker}; train again."
                )
            raise StreamtrainError(
                f"Batch {batch_id}: the parameter server applied {applied} of the {r.steps_total} "
                f"mini-batches of worker {r.worker}'s range; the batch is not committed. Continue "
                f"with: streamtrain run --resume {self.folder}"
            )
        return rows

    def _fault(self, point: str, batch_id: int) -> None:
        """Fault injection for the crash tests (``STREAMTRAIN_FAULT=<point>:<batch>``): SIGKILL
        the driver there (``batch``: inside the batch, before its state is saved; ``saved``:
        after the save, before Spark's commit; ``committed``: after Spark's commit)."""
        if self.fault and self.fault == f"{point}:{batch_id}":
            print(f"fault injection: killed at {self.fault}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
