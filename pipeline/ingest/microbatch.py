"""The micro-batch driver: Kafka -> Spark Structured Streaming -> decoded blocks -> a handler.

Per micro-batch (``foreachBatch(df, batch_id)``) the driver runs the batch's tasks
(:mod:`pipeline.ingest.tasks`: each decodes one offset range on an executor, sends
rejected records to a dead-letter topic, and calls :meth:`Handler.process` with the
decoded block), then calls :meth:`Handler.on_batch` with the batch's figures, before
Spark commits the batch. It stops a query only between a batch's commit and the next.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pipeline import codec
from pipeline.errors import ConfigError, StreamtrainError
from pipeline.ingest import offsets, sources
from pipeline.ingest.batch_figures import BatchFigures
from pipeline.ingest.decode import Block
from pipeline.ingest.kafka.fetch import UnreadableRange
from pipeline.ingest.lag import LagMonitor
from pipeline.ingest.offsets import OffsetRange, TopicPartition
from pipeline.ingest.sizing import Sizing
from pipeline.ingest.stopping import QueryStop, quiet
from pipeline.ingest.tasks import BatchTasks, query_failure

log = logging.getLogger(__name__)


class Handler:
    """What a stream feeds. Subclass it; every method is optional.

    The handler object travels to the executors with each task, so keep it
    small and picklable (addresses and settings, not connections or models).
    """

    #: Whether :meth:`process` needs each record's Kafka key as sent (``Block.keys``).
    wants_keys: bool = False

    def process(self, block: Block) -> Any:
        """Executors: do the work on one decoded block; return its figures."""
        return None

    def on_tasks(self, n: int) -> None:
        """Driver: ``n`` tasks are about to process this micro-batch (Python source only)."""

    def on_batch(self, info: BatchFigures) -> None:
        """Driver: called after every micro-batch, before Spark commits it."""

    def skip(self, batch_id: int, ranges: list[OffsetRange] | None) -> bool:
        """Driver: True for a batch already applied (Spark replays one whose commit was lost).
        ``ranges`` are the batch's merged ranges as Spark logged them (None where the
        source does not say: Spark's JVM source), for the handler to check against what
        it applied under that id."""
        return False


class _ExpectedFailures(logging.Filter):
    """Keeps py4j from logging a traceback for a batch that raised a :class:`StreamtrainError`."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], StreamtrainError))


_PY4J_FILTER = _ExpectedFailures()
#: Batches whose figures a :class:`StreamJob` keeps in memory.
KEEP_BATCHES = 1000


class StreamJob:
    """Runs a streaming query whose micro-batches feed a :class:`Handler`.

    Args:
        spark: the SparkSession.
        bootstrap: Kafka ``host:port``.
        topics: topics to read.
        schema: the record layout to decode.
        handler: what consumes decoded blocks.
        checkpoint: the query's checkpoint folder (offsets, commits); restart from it.
        source: ``auto``, ``python`` or ``jvm`` (see :mod:`pipeline.ingest.sources`).
        trigger_s: seconds between micro-batch starts (0: as fast as possible).
        available_now: read what is there at start, in batches, then stop.
        max_offsets_per_trigger: cap on records per batch.
        min_partitions: split ranges so a batch has at least this many tasks.
        starting_offsets: ``earliest``, ``latest`` or Spark's Kafka JSON.
        dead_letter_topic: where rejected records go (default ``<first topic>.dlq``; "" for none).
        on_lag: called about once a second with the lag (log end minus the end of the last
            handled batch) per topic partition, so that it moves while batches are slow or stalled.
        isolation_level: Kafka's, ``read_committed`` (the default) or ``read_uncommitted``.
        on_unreadable: called with a batch's :class:`UnreadableRange` and the lag it leaves.
        on_poison: a batch that cannot be read stops the stream (``fail``) or is passed over
            (``skip``).
        kafka_conf: the Kafka client properties file (TLS, SASL), by path.
        sizing: size each batch for a freshness target (:mod:`pipeline.ingest.sizing`).
    """

    def __init__(
        self,
        spark: Any,
        *,
        bootstrap: str,
        topics: list[str],
        schema: codec.Schema,
        handler: Handler | None = None,
        checkpoint: str | os.PathLike[str],
        source: str = "auto",
        trigger_s: float = 0.0,
        available_now: bool = False,
        max_offsets_per_trigger: int | None = None,
        min_partitions: int | None = None,
        starting_offsets: str = "earliest",
        dead_letter_topic: str | None = None,
        on_lag: Callable[[dict[TopicPartition, int]], None] | None = None,
        isolation_level: str = "read_committed",
        on_unreadable: Callable[[UnreadableRange, dict[TopicPartition, int]], None] | None = None,
        on_poison: str = "fail",
        kafka_conf: str | None = None,
        sizing: Sizing | None = None,
    ) -> None:
        if not topics:
            raise ConfigError("Expected at least one topic to read.")
        if trigger_s < 0:
            raise ConfigError(f"Expected trigger_s >= 0. Received: {trigger_s}")
        self.spark, self.bootstrap, self.topics, self.schema = spark, bootstrap, topics, schema
        self.handler = handler or Handler()
        self.checkpoint = str(Path(checkpoint).resolve())
        self.source_kind = sources.choose(spark, source, sized=sizing is not None)
        self.sizing = sizing
        self.trigger_s, self.available_now = trigger_s, available_now
        self.max_offsets_per_trigger, self.min_partitions = (
            max_offsets_per_trigger,
            min_partitions or 0,
        )
        self.starting_offsets = starting_offsets
        self.dead_letter_topic = (
            f"{topics[0]}.dlq" if dead_letter_topic is None else dead_letter_topic
        )
        self._tasks = BatchTasks(
            spark,
            bootstrap=bootstrap,
            schema=schema,
            handler=self.handler,
            checkpoint=self.checkpoint,
            python_source=self.source_kind == "python",
            min_partitions=self.min_partitions,
            dead_letter_topic=self.dead_letter_topic,
            isolation_level=isolation_level,
            on_poison=on_poison,
            kafka_conf=kafka_conf,
        )
        self.on_lag, self.on_unreadable = on_lag, on_unreadable
        logging.getLogger("py4j.clientserver").addFilter(
            _PY4J_FILTER
        )  # once: a filter is added only once
        #: The figures of the last :data:`KEEP_BATCHES` batches handled (a job that never stops
        #: keeps a window, not every batch); :attr:`handled` counts them all.
        self.batches: collections.deque[BatchFigures] = collections.deque(maxlen=KEEP_BATCHES)
        self.handled = 0
        self._failure: StreamtrainError | None = (
            None  # what a batch raised, for run() to raise as it was
        )
        self._stop = QueryStop(spark)  # a stop asked for is taken between batches
        self._lag: LagMonitor | None = None
        self._handled: dict[
            TopicPartition, OffsetRange
        ] = {}  # the last handled range per partition

    def use(self, handler: Handler) -> None:
        """Feed the batches to ``handler`` from now on: a job can start its query before its
        handler exists (set it in ``run``'s ``prepare``, which every batch waits for)."""
        self.handler = self._tasks.handler = handler

    # --- per batch ---

    def _on_batch(self, df: Any, batch_id: int) -> None:
        with self._stop.batch():
            planned = None  # read below: an error handler must not meet it unset
            try:
                planned = self._tasks.plan(batch_id)  # Spark's offset log, read once for the batch
                if self.handler.skip(
                    batch_id, None if planned is None else offsets.merge_ranges(planned)
                ):
                    log.info("batch %d was applied before a restart: skipped", batch_id)
                    return
                started, started_at = time.perf_counter(), time.monotonic()
                info = BatchFigures.gather(
                    batch_id, self._tasks.run(df, batch_id, planned), started_at=started_at
                )
                if planned is not None:
                    # What the offset log planned: with Spark's own source the records'
                    # offsets leave out transaction markers and aborted records, and a
                    # partition with nothing to train has no task figure; the plan has both.
                    info.ranges = offsets.merge_ranges(planned)
                info.lag = self._lag.lag(info.ranges) if self._lag else {}
                info.batch_s = time.perf_counter() - started
                info.again = lambda: self._tasks.run(df, batch_id, planned, again=True)
                try:
                    self.handler.on_batch(info)
                finally:
                    info.again = None  # the batch's DataFrame is not kept past its handler
                self.batches.append(info)
                self.handled += 1
                self._handled.update((r.topic_partition, r) for r in info.ranges)
                log.debug(
                    "batch %d: %d records (%d rejected) in %.2f s",
                    batch_id,
                    info.rows,
                    info.rows - info.accepted,
                    info.batch_s,
                )
            except StreamtrainError as e:
                if (
                    isinstance(e, UnreadableRange) and self.on_unreadable is not None
                ):  # its records count as lag
                    self.on_unreadable(e, self._lag.unread(planned or []) if self._lag else {})
                self._failure = e  # Spark wraps it in layers of its own; run() raises it as it was
                quiet(self.spark)
                raise

    # --- the query ---

    def start(self) -> Any:
        """Start the streaming query (non-blocking); :meth:`run` wraps it."""
        isolation = self._tasks.isolation_level
        df = sources.read_stream(
            self.spark,
            bootstrap=self.bootstrap,
            topics=self.topics,
            source=self.source_kind,
            starting_offsets=self.starting_offsets,
            max_offsets_per_trigger=self.max_offsets_per_trigger,
            min_partitions=self.min_partitions,
            checkpoint=self.checkpoint,
            isolation_level=isolation,
            kafka_conf=self._tasks.kafka_conf,
            sizing=self.sizing,
        )
        writer = df.writeStream.foreachBatch(self._on_batch).option(
            "checkpointLocation", self.checkpoint
        )
        if self.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{int(self.trigger_s * 1000)} milliseconds")
        self._lag = LagMonitor(
            self.bootstrap,
            self.topics,
            on_refresh=self._report_lag,
            isolation_level=isolation,
            kafka_conf=self._tasks.kafka_conf,
        ).start()
        return writer.start()

    def run(
        self,
        *,
        max_batches: int | None = None,
        timeout_s: float | None = None,
        until: Callable[[], bool] | None = None,
        prepare: Callable[[], None] | None = None,
    ) -> list[BatchFigures]:
        """Run until ``max_batches`` more batches are done, ``timeout_s`` passes, ``until()``
        is true, or (with ``available_now``) the data at start is drained; return the
        batches' figures.

        ``prepare`` runs in this thread while the query starts in another (seconds of source
        set-up and planning); no batch begins before it returns, and the run stops if it raises.
        ``timeout_s`` counts from its end.
        """
        first = self.handled
        self._failure = None
        query = self._stop.start_while(self.start, prepare, on_abort=self._stop_lag)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s

        def done() -> bool:
            return (
                (max_batches is not None and self.handled - first >= max_batches)
                or (deadline is not None and time.monotonic() > deadline)
                or (until is not None and until())
            )

        try:
            self._stop.wait(
                query,
                done,
                last_batch_id=lambda: self.batches[-1].batch_id if self.batches else None,
                checkpoint=self.checkpoint,
            )
            error = query.exception()
            if error is not None and not self._stop.is_stop(error):
                raise self._failure or query_failure(str(error), self.checkpoint)
        except KeyboardInterrupt:
            self._stop.request()
            query.stop()
            raise
        finally:
            self._stop_lag()
            self._stop.clear()
        _attach_progress(query, self.batches)
        return list(self.batches)[
            len(self.batches) - min(len(self.batches), self.handled - first) :
        ]

    def _stop_lag(self) -> None:
        if self._lag:
            self._lag.stop()

    def _report_lag(self) -> None:
        if self.on_lag is not None and self._lag is not None and self._handled:
            self.on_lag(self._lag.lag(list(self._handled.values())))


def _attach_progress(query: Any, batches: Iterable[BatchFigures]) -> None:
    """Each batch's seconds from its trigger to the handler, from the query's progress reports."""
    by_id = {}
    for p in query.recentProgress:
        d = p.durationMs or {}
        before = sum(
            d.get(k, 0) for k in ("latestOffset", "queryPlanning", "getBatch", "walCommit")
        )
        by_id[p.batchId] = before / 1000
    for info in batches:
        if info.trigger_to_handler_s is None:
            info.trigger_to_handler_s = by_id.get(info.batch_id)
