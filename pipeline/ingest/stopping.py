"""Stopping a streaming query between a batch's commit and the next, never during either.

A :class:`~pipeline.ingest.microbatch.StreamJob` holds one :class:`QueryStop`: each batch
passes through :meth:`QueryStop.batch`, which refuses a batch that starts after a stop was
asked for (it raises, so Spark leaves it uncommitted and a restart replays it with the
same offsets), and :meth:`QueryStop.wait` stops the query once the batch that was
running is in Spark's commit log.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pipeline import cluster
from pipeline.errors import StreamtrainError

#: What a batch refused by a stop raises; the query's error then holds it, and is no failure.
STOP_MARKER = "streamtrain: stop requested before this batch"


def quiet(spark: Any) -> None:
    """Spark's log of the query's failure off (best effort: the error is raised either way)."""
    with contextlib.suppress(Exception):
        cluster.quiet_query_failure(spark)


class QueryStop:
    """A query's stop: asked for from any thread, taken between batches.

    Args:
        spark: the SparkSession (to keep Spark from logging a refused batch as a failure).
    """

    def __init__(self, spark: Any) -> None:
        self._spark = spark
        self._requested = threading.Event()
        self._in_batch = threading.Event()
        self._prepared = threading.Event()
        self._prepared.set()

    def request(self) -> None:
        """Ask for a stop: a batch that starts from now on raises and stays uncommitted."""
        self._requested.set()

    def clear(self) -> None:
        """Forget a stop asked for (the query it was for has stopped)."""
        self._requested.clear()

    @staticmethod
    def is_stop(error: object) -> bool:
        """Whether a query's error is the stop asked for, not a failure."""
        return STOP_MARKER in str(error)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Run one batch: it waits for the job's ``prepare``, and raises if a stop was asked
        for."""
        self._prepared.wait()
        if self._requested.is_set():
            # Raising keeps this batch uncommitted: a restart replays it with the same offsets.
            quiet(self._spark)  # the stop asked for, not a failure for Spark to log
            raise StreamtrainError(STOP_MARKER)
        self._in_batch.set()
        try:
            yield
        finally:
            self._in_batch.clear()

    def start_while(
        self,
        start: Callable[[], Any],
        prepare: Callable[[], None] | None,
        *,
        on_abort: Callable[[], None],
    ) -> Any:
        """Start the query in a thread while ``prepare`` runs in this one; raise what either raised.

        ``prepare`` keeps the calling thread: a process it starts may be tied to the thread
        that started it (Linux's parent-death signal fires when that *thread* ends). No batch
        begins before ``prepare`` returns; where either fails, the query started is stopped
        and ``on_abort`` called.
        """
        if prepare is None:
            return start()
        from pyspark import InheritableThread  # closes its JVM connection when done

        self._prepared.clear()
        started: list[Any] = []
        failed: list[BaseException] = []

        def target() -> None:
            try:
                started.append(start())
            except BaseException as e:
                failed.append(e)

        starting = InheritableThread(target=target, name="start-query", daemon=True)
        starting.start()
        try:
            prepare()
        except BaseException:
            self._requested.set()  # a batch waiting for it raises the stop marker: uncommitted
            raise
        finally:
            self._prepared.set()
            starting.join()
            if self._requested.is_set() or failed:
                for query in started:
                    query.stop()
                self._requested.clear()
                on_abort()
        if failed:
            raise failed[0]
        return started[0]

    def wait(
        self,
        query: Any,
        until: Callable[[], bool],
        *,
        last_batch_id: Callable[[], int | None],
        checkpoint: str,
    ) -> None:
        """Wait while the query runs; once ``until()`` is true, stop it without losing a batch's
        commit.

        Args:
            query: the running StreamingQuery.
            until: polled about every 0.1 s; True stops the query.
            last_batch_id: the id of the last batch handled (None: none yet).
            checkpoint: the query's checkpoint folder, whose commit log is watched.
        """
        from pyspark.errors import StreamingQueryException

        while query.isActive:
            if until():
                self._after_commit(query, last_batch_id, checkpoint)
                return
            try:
                query.awaitTermination(0.1)
            except StreamingQueryException:
                return  # the query failed: the caller reads its exception

    def _after_commit(
        self, query: Any, last_batch_id: Callable[[], int | None], checkpoint: str
    ) -> None:
        """Stop the query without losing a batch's commit."""
        self._requested.set()
        # Let a running batch finish and Spark commit it (stopping during the commit would
        # replay it after a restart); one that starts after this raises and stays uncommitted.
        while self._in_batch.is_set():
            time.sleep(0.02)
        last = last_batch_id()  # read after the running batch is done: it may be that one
        if last is not None:
            _wait_committed(query, last, checkpoint)
        query.stop()


def _wait_committed(query: Any, last: int, checkpoint: str, timeout_s: float = 30.0) -> None:
    """Wait until batch ``last`` is in the commit log and in the progress reports."""
    commit = Path(checkpoint) / "commits" / str(last)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and query.isActive:
        progress = query.lastProgress
        if commit.is_file() and progress is not None and progress["batchId"] >= last:
            return
        time.sleep(0.02)
