"""Reading one exact offset range on an executor, as Arrow record batches.

Raw Fetch requests parsed with numpy (:mod:`pipeline.ingest.kafka.fetch`) by default;
kafka-python's consumer where ``STREAMTRAIN_KAFKA_READER=consumer`` (read once, by
:func:`pipeline.config.settings`), and for what is left of a range whose head is gone
when ``fail_on_data_loss`` is off. Both keep their connection for the life of the
Python worker process (best-effort: Spark reaps idle workers).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

from pipeline import config
from pipeline.errors import BrokerError
from pipeline.ingest import columns
from pipeline.ingest.kafka.record_batch import Skipped
from pipeline.ingest.offsets import OffsetRange

#: Records per Arrow batch that the consumer path yields.
_ARROW_ROWS = 8192

#: (bootstrap, isolation level, client properties file) -> raw Fetch reader / kafka-python
#: consumer, one each per Python worker.
_READERS: dict[tuple[str, str, str | None], Any] = {}
_CONSUMERS: dict[tuple[str, str, str | None], Any] = {}

_ARROW_SCHEMA: Any = None


def arrow_schema() -> Any:
    """:func:`pipeline.ingest.columns.arrow_schema`, built once per process."""
    global _ARROW_SCHEMA
    if _ARROW_SCHEMA is None:
        _ARROW_SCHEMA = columns.arrow_schema()
    return _ARROW_SCHEMA


def gone(topic: str, partition: int, first: int, last: int | None = None) -> BrokerError:
    """The error for records a range needs that Kafka no longer has.

    >>> str(gone("t", 0, 5, 9))  # doctest: +NORMALIZE_WHITESPACE
    'Records 5..9 of t-0 are gone from Kafka (retention or compaction). Set failOnDataLoss=false to
    skip them.'
    """
    which = f"from {first}" if last is None else f"{first}..{last}"
    return BrokerError(
        f"Records {which} of {topic}-{partition} are gone from Kafka (retention or compaction). "
        "Set failOnDataLoss=false to skip them."
    )


def read_range(
    bootstrap: str,
    r: OffsetRange,
    *,
    fail_on_data_loss: bool = True,
    timeout_s: float = 60.0,
    isolation_level: str = "read_committed",
    skipped: Skipped | None = None,
    on_poison: str = "fail",
    kafka_conf: str | None = None,
) -> Iterator[Any]:
    """Yield Arrow record batches (:data:`pipeline.ingest.columns.NAMES`) holding exactly
    the records ``[r.start, r.end)`` that a consumer of ``isolation_level`` reads (with
    ``read_committed``, none of an aborted transaction's). The raw reader adds to
    ``skipped`` what it left out of the range (aborted records, transaction markers, and with
    ``on_poison="skip"`` batches it cannot read; the consumer fallback always stops at those).
    ``kafka_conf`` is the path of the client properties file (TLS, SASL), read here: only
    the path travels in a task."""
    from pipeline.ingest.kafka import conf
    from pipeline.ingest.kafka.fetch import OffsetOutOfRange, RangeReader

    if config.settings().kafka_reader == "consumer":
        yield from _read_with_consumer(
            bootstrap,
            r,
            fail_on_data_loss=fail_on_data_loss,
            timeout_s=timeout_s,
            isolation_level=isolation_level,
            kafka_conf=kafka_conf,
        )
        return
    key = (bootstrap, isolation_level, kafka_conf)
    reader = _READERS.get(key)
    if reader is None or reader.timeout_s != timeout_s:
        if reader is not None:
            reader.close()
        reader = _READERS[key] = RangeReader(
            bootstrap,
            timeout_s=timeout_s,
            isolation_level=isolation_level,
            conf=conf.load(kafka_conf),
        )
    skipped = skipped if skipped is not None else Skipped()
    position = r.start
    try:
        for records in reader.read(
            r.topic, r.partition, r.start, r.end, skipped=skipped, on_poison=on_poison
        ):
            # Only the range's head: gaps inside it are compaction or transaction markers.
            # The first batch the range reached says where its head is, aborted or not.
            first = skipped.first if skipped.first is not None else int(records.offsets[0])
            if position == r.start and first > position and fail_on_data_loss:
                raise gone(r.topic, r.partition, position, first - 1)
            position = int(records.offsets[-1]) + 1
            yield _arrow(records, r)
    except OffsetOutOfRange:
        if fail_on_data_loss:
            raise gone(r.topic, r.partition, position) from None
        rest = dataclasses.replace(r, start=position)
        yield from _read_with_consumer(
            bootstrap,
            rest,
            fail_on_data_loss=False,
            timeout_s=timeout_s,
            isolation_level=isolation_level,
            kafka_conf=kafka_conf,
        )


def _arrow(records: Any, r: OffsetRange) -> Any:
    """Parsed records as an Arrow batch (no per-record Python)."""
    import numpy as np
    import pyarrow as pa

    n = len(records)

    def binary(offsets: Any, data: Any, valid: Any) -> Any:
        nulls = n - int(valid.sum())
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
        return pa.Array.from_buffers(
            pa.binary(), n, [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=nulls
        )

    return pa.RecordBatch.from_arrays(
        [
            binary(records.key_offsets, records.key_data, records.key_valid),
            binary(records.value_offsets, records.value_data, records.value_valid),
            pa.array([r.topic], pa.string()).take(pa.array(np.zeros(n, np.int32))),
            pa.array(np.full(n, r.partition, np.int32)),
            pa.array(records.offsets, pa.int64()),
            pa.array(records.timestamps_ms * 1000, pa.timestamp("us", tz="UTC")),
        ],
        schema=arrow_schema(),
    )


def _consumer(bootstrap: str, isolation_level: str, kafka_conf: str | None) -> Any:
    from pipeline.ingest.kafka import client, conf

    c = _CONSUMERS.get((bootstrap, isolation_level, kafka_conf))
    if c is None:
        c = _CONSUMERS[(bootstrap, isolation_level, kafka_conf)] = client.consumer(
            bootstrap,
            conf=conf.load(kafka_conf),
            max_partition_fetch_bytes=16 << 20,
            fetch_max_bytes=64 << 20,
            max_poll_records=100_000,
            receive_buffer_bytes=4 << 20,
            isolation_level=isolation_level,
        )
    return c


def close_consumers() -> None:
    """Close the consumers :func:`_consumer` keeps for the process's life; for tests and
    shutdown, never while a read is in flight. One left open after its broker stops goes on
    reconnecting to that port in the background, and whatever listens there next gets its
    requests (TLS hellos, with a secured broker's settings)."""
    while _CONSUMERS:
        _, consumer = _CONSUMERS.popitem()
        with contextlib.suppress(Exception):  # one that fails to close leaves the rest to close
            consumer.close()


def _read_with_consumer(
    bootstrap: str,
    r: OffsetRange,
    *,
    fail_on_data_loss: bool = True,
    timeout_s: float = 60.0,
    isolation_level: str = "read_committed",
    kafka_conf: str | None = None,
) -> Iterator[Any]:
    """:func:`read_range` with kafka-python's consumer (per-record Python objects)."""
    import pyarrow as pa
    from kafka import TopicPartition

    from pipeline.ingest.kafka.fetch import UnreadableRange
    from pipeline.ingest.kafka.record_batch import UnreadableBatch

    tp = TopicPartition(r.topic, r.partition)
    c = _consumer(bootstrap, isolation_level, kafka_conf)
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
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(keys, pa.binary()),
                pa.array(values, pa.binary()),
                pa.array([r.topic] * n, pa.string()),
                pa.array([r.partition] * n, pa.int32()),
                pa.array(offsets, pa.int64()),
                pa.array([s * 1000 for s in stamps], pa.timestamp("us", tz="UTC")),
            ],
            schema=arrow_schema(),
        )
        for column in (keys, values, offsets, stamps):
            column.clear()
        return batch

    while position < r.end:
        try:
            got = c.poll(timeout_ms=200, max_records=min(100_000, r.end - position)).get(tp, [])
        except (
            Exception
        ) as e:  # a batch kafka-python cannot read (its codec's own error, or a KafkaError)
            at = c.position(tp)
            raise UnreadableRange(
                r.topic,
                r.partition,
                UnreadableBatch(position if at is None else at, f"{type(e).__name__}: {e}"),
            ) from None
        if not got:
            if c.position(tp) is not None and c.position(tp) >= r.end:
                break  # the rest of the range was aborted records or markers (read_committed)
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"Kafka returned nothing for {r.topic}-{r.partition} at offset {position} "
                    f"(wanted up to {r.end}) within {timeout_s:g} s."
                )
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
        raise gone(r.topic, r.partition, r.start, first_seen - 1)
    if offsets:
        yield flush()
    c.assign([])
