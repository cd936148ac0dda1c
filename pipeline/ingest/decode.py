"""Decoding one task's records: wire format to numpy, rejects to the dead-letter topic,
the rest to the handler, and the figures of it all back to the driver."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline import codec, record_key
from pipeline.ingest import dead_letters
from pipeline.ingest.offsets import OffsetRange, PassedOver

if TYPE_CHECKING:
    from pipeline.ingest.microbatch import Handler


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
        keys: the accepted records' Kafka keys as sent, where the handler asks for them
            (``Handler.wants_keys``); None otherwise (training does not need them).
    """

    topic: str
    partition: int
    x: np.ndarray
    y: np.ndarray
    ids: np.ndarray
    offsets: np.ndarray
    timestamps_ms: np.ndarray
    schema: codec.Schema
    keys: list[bytes | None] | None = None


@dataclasses.dataclass
class TaskFigures:
    """What one task did with one offset range.

    Attributes:
        range: the records ``[start, end)`` it covered.
        rows, bytes: records read and their value bytes.
        accepted: records that decoded (the rest went to the dead-letter topic).
        rejects: rejected records by reason.
        decode_s, handler_s: seconds decoding, and in :meth:`Handler.process`.
        newest_ms: the newest Kafka timestamp (ms) in the range (CreateTime, or LogAppendTime
            where the topic says so), for the model's freshness; None: no records.
        result: what :meth:`Handler.process` returned.
        aborted: records of aborted transactions in the range, not read (read_committed).
        poisoned: offsets of unreadable batches passed over (``--on-poison skip``), and
            ``poison``: each of those batches.
        unreadable: the one line of a batch that stopped the range (``--on-poison fail``),
            returned rather than raised: an expected stop is no executor failure with a
            traceback in Spark's log.
    """

    range: OffsetRange
    rows: int
    bytes: int
    accepted: int
    rejects: dict[str, int]
    decode_s: float
    handler_s: float
    newest_ms: int | None
    result: Any
    aborted: int = 0
    poisoned: int = 0
    poison: list[PassedOver] = dataclasses.field(default_factory=list)
    unreadable: str | None = None


def decode_range(
    batches: Iterator[Any],
    *,
    schema: codec.Schema,
    handler: Handler,
    planned: OffsetRange | None,
    dead_letter: dead_letters.Target | None,
) -> TaskFigures:
    """Decode one task's Arrow batches (one Kafka partition's range), dead-letter the rejects,
    and run the handler on the rest.

    Args:
        batches: Arrow record batches with :data:`pipeline.ingest.columns.NAMES`.
        schema: the record layout.
        handler: what processes the decoded block.
        planned: the range the batches hold, where the driver planned it (else it is
            read off the records).
        dead_letter: where rejected records go, or None to drop them.
    """
    import pyarrow as pa

    from pipeline.ingest.reader import arrow_schema

    started = time.perf_counter()
    table = as_columns(list(batches), arrow_schema())
    values = table.column("value").combine_chunks()
    decoded = codec.decode(values, schema)
    offsets = table.column("offset").to_numpy()
    ok = decoded.accepted
    x, y = decoded.x, decoded.y
    if schema.holdout and len(
        ok
    ):  # the held-out share of a topic's keys scores the model, never trains it
        keep = ~record_key.held_out(
            table.column("key").take(pa.array(ok)).to_pylist(), offsets[ok], schema.holdout
        )
        ok, x, y = ok[keep], x[keep], y[keep]
    ids = record_key.decode_key_array(table.column("key").combine_chunks())
    if ids is None:  # records produced by someone else, without 8-byte ids: use offsets
        ids = offsets.astype(np.uint64)
    stamps = table.column("timestamp").cast(pa.int64()).to_numpy() // 1000
    covered = planned or _covered(table, offsets)
    if decoded.rejected.size and dead_letter is not None:
        dead_letters.send(
            dead_letter, table.take(pa.array(decoded.rejected)).to_pydict(), decoded.reason_names()
        )
    decode_s = time.perf_counter() - started
    keys = table.column("key").take(pa.array(ok)).to_pylist() if handler.wants_keys else None
    block = Block(
        covered.topic, covered.partition, x, y, ids[ok], offsets[ok], stamps[ok], schema, keys
    )
    started = time.perf_counter()
    result = handler.process(block)
    handler_s = time.perf_counter() - started
    # The whole range's newest, rejects and held-out records included: once the batch is
    # applied the center holds everything the range had to teach, up to that time.
    newest = int(stamps.max()) if len(stamps) else None
    nbytes = int(pa.compute.sum(pa.compute.binary_length(values)).as_py() or 0)
    return TaskFigures(
        covered,
        len(table),
        nbytes,
        len(ok),
        decoded.reject_counts(),
        decode_s,
        handler_s,
        newest,
        result,
    )


def as_columns(batches: list[Any], schema: Any) -> Any:
    """``batches`` as one table of ``schema``. Spark's ``mapInArrow`` labels the timestamp
    column with the session's time zone (``Etc/UTC``, ``Europe/Paris``): the same instants,
    relabelled here, so a user's session in any zone decodes alike.

    >>> import pyarrow as pa
    >>> from pipeline.ingest import columns
    >>> schema = columns.arrow_schema()
    >>> paris = pa.schema([f.with_type(pa.timestamp("us", tz="Europe/Paris"))
    ...     if f.name == "timestamp" else f for f in schema])
    >>> batch = pa.RecordBatch.from_pylist(
    ...     [{"key": b"k", "value": b"v", "topic": "t", "partition": 0, "offset": 7,
    ...       "timestamp": 1_000_000}], schema=paris)
    >>> table = as_columns([batch], schema)
    >>> table.schema == schema, table.column("timestamp").cast(pa.int64()).to_pylist()
    (True, [1000000])
    >>> as_columns([], schema).num_rows
    0
    """
    import pyarrow as pa

    if not batches:
        return schema.empty_table()
    table = pa.Table.from_batches(batches)
    return table if table.schema == schema else table.cast(schema)


def _covered(table: Any, offsets: np.ndarray) -> OffsetRange:
    """The range a task's records span, where no plan says it (Spark's JVM source)."""
    if not len(offsets):
        return OffsetRange("", -1, 0, 0)
    return OffsetRange(
        table.column("topic")[0].as_py(),
        table.column("partition")[0].as_py(),
        int(offsets.min()),
        int(offsets.max()) + 1,
    )
