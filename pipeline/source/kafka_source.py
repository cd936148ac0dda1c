"""streamtrain's own Kafka source for Spark Structured Streaming (a Spark 4 Python data source).

It is what runs where Spark's ``spark-sql-kafka`` jar is not on the classpath.
Offsets are Spark's Kafka JSON form, ``{"topic": {"0": 42, "1": 17}}`` (the next
offset to read, per partition), written by Spark to the query's offset log before
a batch runs, so a replayed batch reads exactly the same ranges. Each batch reads
``[start, end)`` of every partition with assign + seek: no consumer group, no
committed offsets in Kafka.

Options (as in Spark's Kafka source): ``kafka.bootstrap.servers``, ``subscribe``
(comma-separated topics) or ``subscribePattern``, ``startingOffsets`` (``earliest``,
``latest`` or JSON with -2 for earliest and -1 for latest), ``maxOffsetsPerTrigger``,
``minPartitions``, ``failOnDataLoss``, ``kafka.fetch.timeout.ms``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pipeline.errors import ConfigError

NAME = "streamtrain-kafka"

#: The columns both Kafka sources give, in this order.
SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
])

Offsets = dict[str, dict[str, int]]

#: Records per Arrow batch that read() yields.
_ARROW_ROWS = 8192


@dataclasses.dataclass(frozen=True)
class OffsetRange(InputPartition):
    """Records ``[start, end)`` of one topic partition: one Spark task."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def count(self) -> int:
        return self.end - self.start


def split_ranges(ranges: list[OffsetRange], min_partitions: int) -> list[OffsetRange]:
    """Split the largest ranges until there are at least ``min_partitions``.

    >>> [r.count for r in split_ranges([OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 0, 10)], 3)]
    [50, 50, 10]
    """
    out = sorted(ranges, key=lambda r: (r.topic, r.partition, r.start))
    while len(out) < min_partitions:
        big = max(out, key=lambda r: r.count, default=None)
        if big is None or big.count < 2:
            break
        mid = big.start + big.count // 2
        i = out.index(big)
        out[i : i + 1] = [dataclasses.replace(big, end=mid), dataclasses.replace(big, start=mid)]
    return out


def cap_offsets(start: Offsets, end: Offsets, max_rows: int) -> Offsets:
    """Limit ``end`` so at most ``max_rows`` records lie between ``start`` and it, spread over
    partitions in proportion to what each has (as Spark's Kafka source does).

    >>> cap_offsets({"t": {"0": 0, "1": 0}}, {"t": {"0": 300, "1": 100}}, 100)
    {'t': {'0': 75, '1': 25}}
    """
    pending = {(t, p): e - start.get(t, {}).get(p, 0) for t, parts in end.items() for p, e in parts.items()}
    total = sum(n for n in pending.values() if n > 0)
    if total <= max_rows:
        return end
    share = {k: (n * max_rows) // total if n > 0 else 0 for k, n in pending.items()}
    # Hand out what integer division left, largest backlog first, so the cap is met exactly.
    left = max_rows - sum(share.values())
    for k in sorted(pending, key=lambda k: -pending[k]):
        if left <= 0:
            break
        if share[k] < pending[k]:
            share[k] += 1
            left -= 1
    capped: Offsets = {}
    for (t, p), n in share.items():
        capped.setdefault(t, {})[p] = start.get(t, {}).get(p, 0) + n if pending[(t, p)] > 0 else end[t][p]
    return capped


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans exact offset ranges on the driver and reads them on the executors."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.bootstrap = options.get("kafka.bootstrap.servers") or ""
        if not self.bootstrap:
            raise ConfigError("The Kafka source needs option kafka.bootstrap.servers (HOST:PORT).")
        topics, pattern = options.get("subscribe"), options.get("subscribePattern")
        if bool(topics) == bool(pattern):
            raise ConfigError("The Kafka source needs exactly one of the options subscribe or subscribePattern.")
        self.topics = [t.strip() for t in topics.split(",") if t.strip()] if topics else []
        self.pattern = re.compile(pattern) if pattern else None
        self.starting = options.get("startingOffsets", "earliest")
        max_rows = options.get("maxOffsetsPerTrigger")
        self.max_rows = int(max_rows) if max_rows else None
        if self.max_rows is not None and self.max_rows < 1:
            raise ConfigError(f"Expected maxOffsetsPerTrigger >= 1. Received: {max_rows}")
        self.min_partitions = int(options.get("minPartitions", "0") or 0)
        self.fail_on_data_loss = options.get("failOnDataLoss", "true").lower() != "false"
        self.fetch_timeout_s = int(options.get("kafka.fetch.timeout.ms", "60000")) / 1000
        # Where the first batch's start is kept: "latest" must mean the same offsets
        # when a query that crashed before committing batch 0 is restarted.
        self.initial_path = options.get("initialOffsetsPath")
        self._target: Offsets | None = None  # Trigger.AvailableNow's end
        self._latest: Offsets | None = None  # the last log-end offsets seen

    # --- driver side ---

    def _edges(self, which: str) -> Offsets:
        """Earliest or latest offsets of every subscribed partition.

        A fresh consumer each call (~60 ms): a reused one carries partition state from
        the previous call (cached high watermarks, fetches still in flight), which
        ``end_offsets`` has to guard against; a fresh one has none.
        """
        from kafka import TopicPartition

        from pipeline.kafka import client

        c = client.consumer(self.bootstrap)
        try:
            topics = self.topics or sorted(t for t in c.topics() if self.pattern and self.pattern.fullmatch(t))
            tps = [TopicPartition(t, p) for t in topics for p in sorted(c.partitions_for_topic(t) or [])]
            found = c.beginning_offsets(tps) if which == "earliest" else client.end_offsets(c, tps)
        finally:
            c.close()
        out: Offsets = {}
        for tp, offset in found.items():
            out.setdefault(tp.topic, {})[str(tp.partition)] = int(offset)
        if which == "latest":
            self._latest = out
        return out

    def initialOffset(self) -> dict:
        if self.initial_path and os.path.exists(self.initial_path):
            with open(self.initial_path) as f:
                kept: dict = json.load(f)
            return kept
        offsets = self._initial_offsets()
        if self.initial_path:
            os.makedirs(os.path.dirname(self.initial_path) or ".", exist_ok=True)
            tmp = f"{self.initial_path}.tmp"
            with open(tmp, "w") as f:
                json.dump(offsets, f)
            os.replace(tmp, self.initial_path)
        return offsets

    def _initial_offsets(self) -> Offsets:
        if self.starting in ("earliest", "latest"):
            return self._edges(self.starting)
        try:
            given = json.loads(self.starting)
        except json.JSONDecodeError:
            raise ConfigError(
                f"Expected startingOffsets earliest, latest or JSON like {{\"topic\": {{\"0\": 42}}}}. "
                f"Received: {self.starting!r}"
            ) from None
        earliest, latest = self._edges("earliest"), self._edges("latest")
        out: Offsets = {}
        for topic, parts in earliest.items():
            for p, low in parts.items():
                chosen = int(given.get(topic, {}).get(p, -2))
                out.setdefault(topic, {})[p] = low if chosen == -2 else latest[topic][p] if chosen == -1 else chosen
        return out

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        end = self._target if self._target is not None else self._edges("latest")
        # A partition that appeared after the start is read from its beginning.
        earliest: Offsets | None = None
        for topic, parts in end.items():
            for p in parts:
                if p not in start.get(topic, {}):
                    earliest = earliest or self._edges("earliest")
                    start = {**start, topic: {**start.get(topic, {}), p: earliest[topic][p]}}
        end = {t: {p: max(o, start.get(t, {}).get(p, 0)) for p, o in parts.items()} for t, parts in end.items()}
        if isinstance(limit, ReadMaxRows):
            end = cap_offsets(start, end, limit.max_rows)
        return end

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def reportLatestOffset(self) -> dict | None:
        # Spark asks right after latestOffset(): the offsets just read serve, saving a round trip.
        return self._latest if self._latest is not None else self._edges("latest")

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._edges("latest")

    def partitions(self, start: dict, end: dict) -> list[OffsetRange]:
        ranges = [
            OffsetRange(topic, int(p), int(start.get(topic, {}).get(p, 0)), int(e))
            for topic, parts in end.items() for p, e in parts.items()
            if int(e) > int(start.get(topic, {}).get(p, 0))
        ]
        return split_ranges(ranges, self.min_partitions)

    def commit(self, end: dict) -> None:
        pass  # offsets live in Spark's checkpoint, not in Kafka

    # --- executor side ---

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, OffsetRange)
        yield from read_range(self.bootstrap, partition, fail_on_data_loss=self.fail_on_data_loss,
                              timeout_s=self.fetch_timeout_s)


#: bootstrap -> consumer, kept for the life of the Python worker process (best-effort).
_CONSUMERS: dict[str, Any] = {}


def _range_consumer(bootstrap: str) -> Any:
    from pipeline.kafka import client

    c = _CONSUMERS.get(bootstrap)
    if c is None:
        c = _CONSUMERS[bootstrap] = client.consumer(
            bootstrap, max_partition_fetch_bytes=16 << 20, fetch_max_bytes=64 << 20, max_poll_records=100_000,
            receive_buffer_bytes=4 << 20,
        )
    return c


#: bootstrap -> raw Fetch reader, kept like the consumers above.
_READERS: dict[str, Any] = {}


def read_range(bootstrap: str, r: OffsetRange, *, fail_on_data_loss: bool = True,
               timeout_s: float = 60.0) -> Iterator[Any]:
    """Yield Arrow record batches holding exactly the records ``[r.start, r.end)``.

    Read with raw Fetch requests parsed by numpy (:mod:`pipeline.kafka.fetch`), several
    times faster than kafka-python's consumer; the consumer reads instead where
    ``STREAMTRAIN_KAFKA_READER=consumer``, and takes over a range whose first offsets
    are gone when ``fail_on_data_loss`` is off (it skips to what is left).
    """
    from pipeline.errors import BrokerError
    from pipeline.kafka.fetch import OffsetOutOfRange, RangeReader

    if os.environ.get("STREAMTRAIN_KAFKA_READER", "fetch") == "consumer":
        yield from _read_range_consumer(bootstrap, r, fail_on_data_loss=fail_on_data_loss, timeout_s=timeout_s)
        return
    reader = _READERS.get(bootstrap)
    if reader is None or reader.timeout_s != timeout_s:
        if reader is not None:
            reader.close()
        reader = _READERS[bootstrap] = RangeReader(bootstrap, timeout_s=timeout_s)
    position = r.start
    try:
        for records in reader.read(r.topic, r.partition, r.start, r.end):
            first = int(records.offsets[0])
            # Only the range's head: gaps inside it are compaction or transaction markers.
            if position == r.start and first > position and fail_on_data_loss:
                raise BrokerError(f"Records {position}..{first - 1} of {r.topic}-{r.partition} are gone from Kafka "
                                  "(retention or compaction). Set failOnDataLoss=false to skip them.")
            position = int(records.offsets[-1]) + 1
            yield _arrow(records, r)
    except OffsetOutOfRange:
        if fail_on_data_loss:
            raise BrokerError(f"Records from {position} of {r.topic}-{r.partition} are gone from Kafka "
                              "(retention or compaction). Set failOnDataLoss=false to skip them.") from None
        rest = dataclasses.replace(r, start=position)
        yield from _read_range_consumer(bootstrap, rest, fail_on_data_loss=False, timeout_s=timeout_s)


def _arrow(records: Any, r: OffsetRange) -> Any:
    """Parsed records as an Arrow batch with :data:`ARROW_SCHEMA` (no per-record Python)."""
    import numpy as np
    import pyarrow as pa

    n = len(records)

    def binary(offsets: Any, data: Any, valid: Any) -> Any:
        nulls = n - int(valid.sum())
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
        return pa.Array.from_buffers(pa.binary(), n, [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)],
                                     null_count=nulls)

    return pa.RecordBatch.from_arrays([
        binary(records.key_offsets, records.key_data, records.key_valid),
        binary(records.value_offsets, records.value_data, records.value_valid),
        pa.array([r.topic], pa.string()).take(pa.array(np.zeros(n, np.int32))),
        pa.array(np.full(n, r.partition, np.int32)),
        pa.array(records.offsets, pa.int64()),
        pa.array(records.timestamps_ms * 1000, pa.timestamp("us", tz="UTC")),
    ], schema=ARROW_SCHEMA)


def _read_range_consumer(bootstrap: str, r: OffsetRange, *, fail_on_data_loss: bool = True,
                         timeout_s: float = 60.0) -> Iterator[Any]:
    """:func:`read_range` with kafka-python's consumer (per-record Python objects)."""
    import pyarrow as pa
    from kafka import TopicPartition

    from pipeline.errors import BrokerError

    tp = TopicPartition(r.topic, r.partition)
    c = _range_consumer(bootstrap)
    c.assign([tp])
    c.seek(tp, r.start)
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    offsets: list[int] = []
    stamps: list[int] = []
    first_seen: int | None = None
    position = r.start
    deadline = time.monotonic() + timeout_s

    def flush() -> Any:
        n = len(offsets)
        batch = pa.RecordBatch.from_arrays([
            pa.array(keys, pa.binary()), pa.array(values, pa.binary()),
            pa.array([r.topic] * n, pa.string()), pa.array([r.partition] * n, pa.int32()),
            pa.array(offsets, pa.int64()), pa.array([s * 1000 for s in stamps], pa.timestamp("us", tz="UTC")),
        ], schema=ARROW_SCHEMA)
        for column in (keys, values, offsets, stamps):
            column.clear()
        return batch

    while position < r.end:
        got = c.poll(timeout_ms=200, max_records=min(100_000, r.end - position)).get(tp, [])
        if not got:
            if time.monotonic() > deadline:
                raise BrokerError(f"Kafka returned nothing for {r.topic}-{r.partition} at offset {position} "
                                  f"(wanted up to {r.end}) within {timeout_s:g} s.")
            continue
        deadline = time.monotonic() + timeout_s
        for rec in got:
            if rec.offset >= r.end:
                break
            if rec.offset < position:
                continue
            if first_seen is None:
                first_seen = rec.offset
            keys.append(rec.key)
            values.append(rec.value)
            offsets.append(rec.offset)
            stamps.append(rec.timestamp)
        position = max(position, got[-1].offset + 1)
        if len(offsets) >= _ARROW_ROWS:
            yield flush()
    if fail_on_data_loss and first_seen is not None and first_seen > r.start:
        raise BrokerError(f"Records {r.start}..{first_seen - 1} of {r.topic}-{r.partition} are gone from Kafka "
                          "(retention or compaction). Set failOnDataLoss=false to skip them.")
    if offsets:
        yield flush()
    c.assign([])


def _arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                      ("partition", pa.int32()), ("offset", pa.int64()),
                      ("timestamp", pa.timestamp("us", tz="UTC"))])


ARROW_SCHEMA = _arrow_schema()


class KafkaDataSource(DataSource):
    """``spark.readStream.format("streamtrain-kafka")``, once registered with :func:`register`."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(self.options)  # case-insensitive keys, as Spark options are


def register(spark: Any) -> None:
    """Make ``format("streamtrain-kafka")`` available in this Spark session."""
    spark.dataSource.register(KafkaDataSource)
