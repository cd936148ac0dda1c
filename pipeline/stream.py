"""The micro-batch driver: Kafka -> Spark Structured Streaming -> decoded blocks -> a handler.

Per micro-batch (``foreachBatch(df, batch_id)``) the driver takes the batch's
offset ranges from the query's offset log (Spark wrote them before calling us,
and replays a failed batch with the same id and ranges), decodes each range on
an executor into numpy arrays, sends rejected records to a dead-letter topic,
and calls the handler: :meth:`Handler.process` on the executors with each
decoded block, then :meth:`Handler.on_batch` on the driver with the batch's
figures.

With streamtrain's Python source the ranges are read by one Spark task each
(assign + seek), so a task holds one Python worker, not one for the source and
one for the handler; with Spark's JVM source the batch's DataFrame is decoded
with ``mapInArrow``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import codec
from pipeline import source as kafka_sources
from pipeline.errors import ConfigError, StreamtrainError
from pipeline.source.kafka_source import OffsetRange, read_range, split_ranges

log = logging.getLogger(__name__)

_STOP_MARKER = "streamtrain: stop requested before this batch"


@dataclasses.dataclass
class Block:
    """The decoded, trainable records of one offset range (on an executor).

    Attributes:
        topic, partition: where the records come from.
        x, y: features (wire dtype) and labels of the accepted records.
        ids: record ids from the Kafka keys (the offset where a key is missing).
        offsets: Kafka offsets of the accepted records.
        timestamps_ms: event times of the accepted records.
        schema: the record layout.
    """

    topic: str
    partition: int
    x: np.ndarray
    y: np.ndarray
    ids: np.ndarray
    offsets: np.ndarray
    timestamps_ms: np.ndarray
    schema: codec.Schema


class Handler:
    """What a stream feeds. Subclass it; every method is optional.

    The handler object travels to the executors with each task, so keep it
    small and picklable (addresses and settings, not connections or models).
    """

    def process(self, block: Block) -> dict[str, Any]:
        """Executors: do the work on one decoded block; return JSON-able figures."""
        return {}

    def on_tasks(self, n: int) -> None:
        """Driver: ``n`` tasks are about to process this micro-batch (Python source only)."""

    def on_batch(self, info: BatchInfo) -> None:
        """Driver: called after every micro-batch, before Spark commits it."""

    def skip(self, batch_id: int) -> bool:
        """Driver: True for a batch already applied (Spark replays one whose commit was lost)."""
        return False


@dataclasses.dataclass
class RangeFigures:
    """What one task did with one offset range."""

    topic: str
    partition: int
    start: int
    end: int
    rows: int
    bytes: int
    accepted: int
    rejects: dict[str, int]
    decode_s: float
    handler_s: float
    result: dict[str, Any]


@dataclasses.dataclass
class BatchInfo:
    """Figures of one micro-batch.

    ``ranges`` are the planned ``[start, end)`` of every Kafka partition the batch
    covered; ``lag`` is log-end minus ``end`` per ``topic-partition`` when the batch
    finished; ``trigger_to_handler_s`` (from Spark's progress report) is filled in
    once the query reports it.
    """

    batch_id: int
    ranges: list[tuple[str, int, int, int]]
    rows: int = 0
    bytes: int = 0
    accepted: int = 0
    rejects: dict[str, int] = dataclasses.field(default_factory=dict)
    decode_s: float = 0.0
    handler_s: float = 0.0
    batch_s: float = 0.0
    lag: dict[str, int] = dataclasses.field(default_factory=dict)
    trigger_to_handler_s: float | None = None
    results: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    started_at: float = 0.0  # time.monotonic() when the batch reached the driver


# --- executor side -----------------------------------------------------------------------

_DLQ_PRODUCERS: dict[str, Any] = {}


def _dead_letter(bootstrap: str, topic: str, records: dict[str, list[Any]], reasons: list[str]) -> None:
    """Send rejected records, original bytes and key, with the reason and origin as headers."""
    from kafka import KafkaProducer

    producer = _DLQ_PRODUCERS.get(bootstrap)
    if producer is None:
        producer = _DLQ_PRODUCERS[bootstrap] = KafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                                             enable_idempotence=True, linger_ms=5)
    for i, reason in enumerate(reasons):
        origin = {k: str(records[k][i]).encode() for k in ("topic", "partition", "offset")}
        headers = [("streamtrain.reason", reason.encode())] + [(f"streamtrain.{k}", v) for k, v in origin.items()]
        producer.send(topic, value=records["value"][i], key=records["key"][i], headers=headers)
    # Before the batch commits: a record is never both untrained and out of the dead-letter topic.
    producer.flush()


def process_arrow(
    batches: Iterator[Any], *, schema: codec.Schema, handler: Handler, planned: OffsetRange | None,
    dead_letters: tuple[str, str] | None,
) -> RangeFigures:
    """Decode one task's Arrow batches (one Kafka partition's range), dead-letter the rejects,
    and run the handler on the rest."""
    import pyarrow as pa

    started = time.perf_counter()
    table = pa.Table.from_batches(list(batches), schema=kafka_sources.kafka_source.ARROW_SCHEMA)
    values = table.column("value").combine_chunks()
    decoded = codec.decode(values, schema)
    offsets = table.column("offset").to_numpy()
    ok = decoded.accepted
    ids = codec.decode_key_array(table.column("key").combine_chunks())
    if ids is None:  # records produced by someone else, without 8-byte ids: use offsets
        ids = offsets.astype(np.uint64)
    stamps = table.column("timestamp").cast(pa.int64()).to_numpy() // 1000
    topic = planned.topic if planned else (table.column("topic")[0].as_py() if len(table) else "")
    partition = planned.partition if planned else (table.column("partition")[0].as_py() if len(table) else -1)
    if decoded.rejected.size and dead_letters is not None:
        _dead_letter(*dead_letters, table.take(pa.array(decoded.rejected)).to_pydict(), decoded.reason_names())
    decode_s = time.perf_counter() - started
    block = Block(topic, partition, decoded.x, decoded.y, ids[ok], offsets[ok], stamps[ok], schema)
    started = time.perf_counter()
    result = handler.process(block)
    handler_s = time.perf_counter() - started
    if planned is not None:
        start, end = planned.start, planned.end
    else:
        start, end = (int(offsets.min()), int(offsets.max()) + 1) if len(offsets) else (0, 0)
    nbytes = int(pa.compute.sum(pa.compute.binary_length(values)).as_py() or 0)
    return RangeFigures(topic, partition, start, end, len(table), nbytes, len(ok), decoded.reject_counts(),
                        decode_s, handler_s, result)


# --- driver side ---------------------------------------------------------------------------


def read_offset_log(checkpoint: str, batch_id: int) -> dict[str, dict[str, int]] | None:
    """The end offsets Spark logged for ``batch_id`` (its write-ahead log), or None."""
    path = Path(checkpoint) / "offsets" / str(batch_id)
    if not path.is_file():
        return None
    lines = path.read_text().splitlines()
    # Line 1 is the log version, line 2 the batch metadata, then one offset per source.
    return json.loads(lines[2]) if len(lines) > 2 and lines[2] != "-" else None


class LagMonitor:
    """Log-end offsets of the stream's partitions, refreshed in the background."""

    def __init__(self, bootstrap: str, topics: list[str], interval_s: float = 1.0,
                 on_refresh: Callable[[], None] | None = None) -> None:
        self.bootstrap, self.topics, self.interval_s = bootstrap, topics, interval_s
        self.on_refresh = on_refresh
        self.ends: dict[tuple[str, int], int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lag-monitor", daemon=True)

    def start(self) -> LagMonitor:
        self._thread.start()
        return self

    def _loop(self) -> None:
        from kafka import TopicPartition

        from pipeline.kafka import client

        while not self._stop.is_set():
            # A fresh consumer each time, as the source's planner uses (see kafka_source._edges).
            c = client.consumer(self.bootstrap)
            try:
                tps = [TopicPartition(t, p) for t in self.topics for p in client.partitions_for(c, t)]
                found = client.end_offsets(c, tps, timeout_s=5)
                self.ends = {(tp.topic, tp.partition): n for tp, n in found.items()}
                if self.on_refresh is not None:
                    self.on_refresh()
            except Exception as e:  # lag is a figure, never a reason to stop training
                log.debug("lag refresh failed: %s", e)
            finally:
                c.close()
            self._stop.wait(self.interval_s)

    def lag(self, ranges: list[tuple[str, int, int, int]]) -> dict[str, int]:
        ends = self.ends
        return {f"{t}-{p}": max(0, ends[(t, p)] - end) for t, p, _, end in ranges if (t, p) in ends}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


class StreamJob:
    """Runs a streaming query whose micro-batches feed a :class:`Handler`.

    Args:
        spark: the SparkSession.
        bootstrap: Kafka ``host:port``.
        topics: topics to read.
        schema: the record layout to decode.
        handler: what consumes decoded blocks.
        checkpoint: the query's checkpoint folder (offsets, commits); restart from it.
        source: ``auto``, ``python`` or ``jvm`` (see :mod:`pipeline.source`).
        trigger_s: seconds between micro-batch starts (0: as fast as possible).
        available_now: read what is there at start, in batches, then stop.
        max_offsets_per_trigger: cap on records per batch.
        min_partitions: split ranges so a batch has at least this many tasks.
        starting_offsets: ``earliest``, ``latest`` or Spark's Kafka JSON.
        dead_letter_topic: where rejected records go (default ``<first topic>.dlq``; "" for none).
        on_lag: called about once a second with the lag (log end minus the end of the
            last handled batch) of every ``topic-partition`` handled so far, so that lag
            keeps moving while batches are slow or stalled.
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
        on_lag: Callable[[dict[str, int]], None] | None = None,
    ) -> None:
        if not topics:
            raise ConfigError("Expected at least one topic to read.")
        if trigger_s < 0:
            raise ConfigError(f"Expected trigger_s >= 0. Received: {trigger_s}")
        self.spark = spark
        self.bootstrap = bootstrap
        self.topics = topics
        self.schema = schema
        self.handler = handler or Handler()
        self.checkpoint = str(Path(checkpoint).resolve())
        self.source_kind = kafka_sources.choose(spark, source)
        self.trigger_s = trigger_s
        self.available_now = available_now
        self.max_offsets_per_trigger = max_offsets_per_trigger
        self.min_partitions = min_partitions or 0
        self.starting_offsets = starting_offsets
        self.dead_letter_topic = f"{topics[0]}.dlq" if dead_letter_topic is None else dead_letter_topic
        self.batches: list[BatchInfo] = []
        self._stop_requested = threading.Event()
        self._in_batch = threading.Event()
        self._prepared = threading.Event()
        self._prepared.set()
        self._lag: LagMonitor | None = None
        self.on_lag = on_lag
        self._handled: dict[tuple[str, int], tuple[str, int, int, int]] = {}  # the last handled range per partition

    # --- per batch ---

    def _planned_ranges(self, batch_id: int) -> list[OffsetRange]:
        end = read_offset_log(self.checkpoint, batch_id)
        if end is None:
            raise StreamtrainError(f"No offsets logged for batch {batch_id} in {self.checkpoint}/offsets.")
        if batch_id > 0:
            start = read_offset_log(self.checkpoint, batch_id - 1) or {}
        else:
            with open(kafka_sources.initial_offsets_path(self.checkpoint)) as f:
                start = json.load(f)
        ranges = [OffsetRange(t, int(p), int(start.get(t, {}).get(p, 0)), int(e))
                  for t, parts in end.items() for p, e in parts.items() if int(e) > int(start.get(t, {}).get(p, 0))]
        return split_ranges(ranges, self.min_partitions)

    def _run_tasks(self, df: Any, batch_id: int) -> list[RangeFigures]:
        schema, handler = self.schema, self.handler
        dead = (self.bootstrap, self.dead_letter_topic) if self.dead_letter_topic else None
        if self.source_kind == "python":
            ranges = self._planned_ranges(batch_id)
            if not ranges:
                return []
            bootstrap = self.bootstrap

            def task(part: Iterator[OffsetRange]) -> Iterator[str]:
                for r in part:
                    figures = process_arrow(read_range(bootstrap, r), schema=schema, handler=handler,
                                            planned=r, dead_letters=dead)
                    yield json.dumps(dataclasses.asdict(figures))

            handler.on_tasks(len(ranges))
            sc = self.spark.sparkContext
            sc.setJobDescription(f"streamtrain batch {batch_id}")
            rows = sc.parallelize(ranges, len(ranges)).mapPartitions(task).collect()
            return [RangeFigures(**json.loads(r)) for r in rows]

        def arrow_task(batches: Iterator[Any]) -> Iterator[Any]:
            import pyarrow as pa

            figures = process_arrow(batches, schema=schema, handler=handler, planned=None, dead_letters=dead)
            yield pa.RecordBatch.from_pylist([{"figures": json.dumps(dataclasses.asdict(figures))}])

        rows = df.mapInArrow(arrow_task, "figures string").collect()
        return [f for f in (RangeFigures(**json.loads(r["figures"])) for r in rows) if f.rows]

    def _on_batch(self, df: Any, batch_id: int) -> None:
        self._prepared.wait()
        if self._stop_requested.is_set():
            # Raising keeps this batch uncommitted: a restart replays it with the same offsets.
            raise StreamtrainError(_STOP_MARKER)
        self._in_batch.set()
        try:
            if self.handler.skip(batch_id):
                log.info("batch %d was applied before a restart: skipped", batch_id)
                return
            started, started_at = time.perf_counter(), time.monotonic()
            figures = self._run_tasks(df, batch_id)
            info = BatchInfo(batch_id, [(f.topic, f.partition, f.start, f.end) for f in figures], started_at=started_at)
            for f in figures:
                info.rows += f.rows
                info.bytes += f.bytes
                info.accepted += f.accepted
                info.decode_s += f.decode_s
                info.handler_s += f.handler_s
                for reason, n in f.rejects.items():
                    info.rejects[reason] = info.rejects.get(reason, 0) + n
                info.results.append(f.result)
            info.ranges = _merge_ranges(info.ranges)
            info.lag = self._lag.lag(info.ranges) if self._lag else {}
            info.batch_s = time.perf_counter() - started
            self.handler.on_batch(info)
            self.batches.append(info)
            self._handled.update(((r[0], r[1]), r) for r in info.ranges)
            log.debug("batch %d: %d records (%d rejected) in %.2f s", batch_id, info.rows, info.rows - info.accepted,
                     info.batch_s)
        finally:
            self._in_batch.clear()

    # --- the query ---

    def start(self) -> Any:
        """Start the streaming query (non-blocking); :meth:`run` wraps it."""
        df = kafka_sources.read_stream(
            self.spark, bootstrap=self.bootstrap, topics=self.topics, source=self.source_kind,
            starting_offsets=self.starting_offsets, max_offsets_per_trigger=self.max_offsets_per_trigger,
            min_partitions=self.min_partitions, checkpoint=self.checkpoint,
        )
        writer = df.writeStream.foreachBatch(self._on_batch).option("checkpointLocation", self.checkpoint)
        if self.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{int(self.trigger_s * 1000)} milliseconds")
        self._lag = LagMonitor(self.bootstrap, self.topics, on_refresh=self._report_lag).start()
        return writer.start()

    def run(self, *, max_batches: int | None = None, timeout_s: float | None = None,
            until: Callable[[], bool] | None = None, prepare: Callable[[], None] | None = None) -> list[BatchInfo]:
        """Run until ``max_batches`` more batches are done, ``timeout_s`` passes, ``until()``
        is true, or (with ``available_now``) the data at start is drained; return the
        batches' figures.

        ``prepare`` runs in a thread while the query starts (seconds of source set-up and
        planning); no batch begins before it returns, and the run stops if it raises.
        ``timeout_s`` counts from its end.
        """
        preparing = None
        if prepare is not None:
            from pyspark import InheritableThread  # closes its JVM connection when done

            self._prepared.clear()
            failed: list[BaseException] = []

            def target() -> None:
                try:
                    prepare()
                except BaseException as e:
                    failed.append(e)
                    self._stop_requested.set()  # a batch waiting for it raises the stop marker: uncommitted
                finally:
                    self._prepared.set()

            preparing = InheritableThread(target=target, name="prepare", daemon=True)
            preparing.start()
        try:
            query = self.start()
        finally:
            if preparing is not None:
                preparing.join()
        first = len(self.batches)
        if prepare is not None and failed:
            query.stop()
            self._stop_requested.clear()
            if self._lag:
                self._lag.stop()
            raise failed[0]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while query.isActive:
                done = len(self.batches) - first
                if ((max_batches is not None and done >= max_batches) or (deadline and time.monotonic() > deadline)
                        or (until is not None and until())):
                    self._stop_requested.set()
                    # Let a running batch finish and Spark commit it (stopping during the commit
                    # would replay it after a restart); one that starts after this raises and
                    # stays uncommitted.
                    while self._in_batch.is_set():
                        time.sleep(0.02)
                    self._wait_committed(query)
                    query.stop()
                    break
                query.awaitTermination(0.1)
            error = query.exception()
            if error is not None and _STOP_MARKER not in str(error):
                raise StreamtrainError(f"The streaming query failed: {str(error).splitlines()[0]}")
        except KeyboardInterrupt:
            self._stop_requested.set()
            query.stop()
            raise
        finally:
            if self._lag:
                self._lag.stop()
            self._stop_requested.clear()
        self._attach_progress(query)
        return self.batches[first:]

    def _report_lag(self) -> None:
        if self.on_lag is not None and self._lag is not None and self._handled:
            self.on_lag(self._lag.lag(list(self._handled.values())))

    def _wait_committed(self, query: Any, timeout_s: float = 30.0) -> None:
        """Wait until the last handled batch is in the commit log and in the progress reports."""
        if not self.batches:
            return
        last = self.batches[-1].batch_id
        commit = Path(self.checkpoint) / "commits" / str(last)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and query.isActive:
            progress = query.lastProgress
            if commit.is_file() and progress is not None and progress["batchId"] >= last:
                return
            time.sleep(0.02)

    def _attach_progress(self, query: Any) -> None:
        by_id = {}
        for p in query.recentProgress:
            d = p.durationMs or {}
            before = sum(d.get(k, 0) for k in ("latestOffset", "queryPlanning", "getBatch", "walCommit"))
            by_id[p.batchId] = before / 1000
        for info in self.batches:
            if info.trigger_to_handler_s is None:
                info.trigger_to_handler_s = by_id.get(info.batch_id)


def _merge_ranges(ranges: list[tuple[str, int, int, int]]) -> list[tuple[str, int, int, int]]:
    """Join adjacent ranges of one partition (split for parallelism) back into one.

    >>> _merge_ranges([("t", 0, 5, 9), ("t", 0, 0, 5), ("t", 1, 0, 2)])
    [('t', 0, 0, 9), ('t', 1, 0, 2)]
    """
    out: list[tuple[str, int, int, int]] = []
    for t, p, s, e in sorted(ranges):
        if out and out[-1][:2] == (t, p) and out[-1][3] == s:
            out[-1] = (t, p, out[-1][2], e)
        else:
            out.append((t, p, s, e))
    return out
