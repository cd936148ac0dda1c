"""One micro-batch's tasks: which ranges, read and decoded where, and their figures back.

With streamtrain's Python source the driver plans the batch's ranges itself from
the offsets Spark logged for it (its write-ahead log: Spark wrote them before calling
foreachBatch and replays a failed batch with the same id and offsets; the source's
own planner runs in a process of Spark's, so the log is the one record the driver
can read) with the same planner as the source, :func:`pipeline.ingest.offsets.plan`;
each task then reads its range and processes it in one Python worker. With Spark's
JVM source the batch's DataFrame is decoded with ``mapInArrow``.
"""

from __future__ import annotations

import contextlib
import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import cluster, codec
from pipeline.errors import StreamtrainError
from pipeline.ingest import dead_letters, offsets, sources
from pipeline.ingest.decode import TaskFigures, decode_range
from pipeline.ingest.kafka.fetch import UnreadableRange, isolation_id
from pipeline.ingest.kafka.record_batch import Skipped
from pipeline.ingest.offsets import OffsetRange, PassedOver
from pipeline.ingest.reader import read_range

if TYPE_CHECKING:
    from pipeline.ingest.microbatch import Handler


def logged_offsets(checkpoint: str, batch_id: int) -> offsets.Offsets | None:
    """The end offsets Spark logged for ``batch_id`` (its write-ahead log), or None;
    for batch -1, the start the Python source kept for the query's first batch."""
    if batch_id < 0:
        path = Path(sources.initial_offsets_path(checkpoint))
        if path.is_file():
            return json.loads(path.read_text())
        # Spark's own source keeps them in its source log: a zero byte, "v1", then the JSON.
        path = Path(checkpoint) / "sources" / "0" / "0"
        if not path.is_file():
            return None
        lines = path.read_text().lstrip("\x00").splitlines()
        return json.loads(lines[1]) if len(lines) > 1 else None
    path = Path(checkpoint) / "offsets" / str(batch_id)
    if not path.is_file():
        return None
    lines = path.read_text().splitlines()
    # Line 1 is the log version, line 2 the batch metadata, then one offset per source.
    return json.loads(lines[2]) if len(lines) > 2 and lines[2] != "-" else None


def _error_classes() -> dict[str, type[StreamtrainError]]:
    """Every streamtrain error class by name (the subclasses imported so far)."""
    found: dict[str, type[StreamtrainError]] = {}
    todo: list[type[StreamtrainError]] = [StreamtrainError]
    while todo:
        cls = todo.pop()
        found[cls.__name__] = cls
        todo += cls.__subclasses__()
    return found


def executor_error(e: BaseException) -> StreamtrainError | None:
    r"""The streamtrain error a task raised on an executor, rebuilt on the driver from the
    traceback text Spark hands back (None where the task failed otherwise), so that the
    run prints its one line rather than Spark's layers around it.

    >>> spark_text = "Job aborted.\nTraceback...\npipeline.errors.DataError: no file x\n\tat org..."
    >>> executor_error(RuntimeError(spark_text))
    DataError('no file x')
    """
    classes = _error_classes()
    found = None
    for line in str(e).splitlines():
        name, sep, message = line.strip().partition(": ")
        if sep and name.startswith("pipeline.") and name.rpartition(".")[2] in classes:
            found = (classes[name.rpartition(".")[2]], message)
    if found is None:
        return None
    rebuilt = getattr(found[0], "from_message", None)
    if rebuilt is not None and (again := rebuilt(found[1])) is not None:
        return again
    # Rebuilt as its nearest class in pipeline.errors, whose constructor takes the message alone.
    cls = next(c for c in found[0].__mro__ if c.__module__ == "pipeline.errors")
    return cls(found[1])


def query_failure(error: str, checkpoint: str) -> StreamtrainError:
    """One line for a failed query; a full disk says where and what to do.

    >>> str(
    ...     query_failure("java.io.IOException: No space left on device\\n\\tat x", "/out/ckpt")
    ... )  # doctest: +NORMALIZE_WHITESPACE
    'The streaming query could not write its checkpoint /out/ckpt: no space left on device. Free
    space there, then resume (the batch it was writing is replayed, nothing is lost).'
    """
    if "No space left on device" in error or "Disk quota exceeded" in error:
        return StreamtrainError(
            f"The streaming query could not write its checkpoint {checkpoint}: no space left on "
            "device. Free space there, then resume (the batch it was writing is replayed, "
            "nothing is lost)."
        )
    return StreamtrainError(f"The streaming query failed: {error.splitlines()[0]}")


class BatchTasks:
    """Runs a micro-batch's tasks and collects their figures.

    Args:
        spark: the SparkSession.
        bootstrap: Kafka ``host:port``.
        schema: the record layout to decode.
        handler: what processes each decoded block.
        checkpoint: the query's checkpoint folder (where Spark logs each batch's offsets).
        python_source: whether the query reads with streamtrain's Python source.
        min_partitions: split ranges so a batch has at least this many tasks.
        dead_letter_topic: where rejected records go ("" for nowhere).
        isolation_level: ``read_committed`` or ``read_uncommitted``, as Kafka's consumer.
        kafka_conf: the Kafka client properties file (TLS, SASL), by path.
        on_poison: ``fail`` (a batch that cannot be read stops the stream) or ``skip`` (it
            is passed over: its offsets and cause counted, and sent to the dead-letter topic).
    """

    def __init__(
        self,
        spark: Any,
        *,
        bootstrap: str,
        schema: codec.Schema,
        handler: Handler,
        checkpoint: str,
        python_source: bool,
        min_partitions: int,
        dead_letter_topic: str,
        isolation_level: str = "read_committed",
        on_poison: str = "fail",
        kafka_conf: str | None = None,
    ) -> None:
        self.kafka_conf = kafka_conf
        self.spark, self.bootstrap, self.schema, self.handler = spark, bootstrap, schema, handler
        self.on_poison = on_poison
        self.isolation_level = isolation_level
        isolation_id(isolation_level)  # a bad value fails here, not in a task
        self.checkpoint, self.python_source, self.min_partitions = (
            checkpoint,
            python_source,
            min_partitions,
        )
        self.dead_letter = (
            dead_letters.Target(bootstrap, dead_letter_topic, kafka_conf)
            if dead_letter_topic
            else None
        )
        self._last_end: tuple[int, offsets.Offsets] | None = (
            None  # the last batch planned, and its end
        )

    def plan(self, batch_id: int) -> list[OffsetRange] | None:
        """The tasks' ranges of ``batch_id``, as the Python source planned them from the
        offsets Spark logged; with Spark's own source, one range per partition from the same
        log (Spark cuts its tasks itself), or None where the log does not say where it began."""
        end = logged_offsets(self.checkpoint, batch_id)
        if end is None:
            if not self.python_source:
                return None
            raise StreamtrainError(
                f"No offsets logged for batch {batch_id} in {self.checkpoint}/offsets."
            )
        # A batch starts where the one before ended: read from the log once, when that one ran here.
        last = self._last_end
        start = (
            last[1]
            if last is not None and last[0] == batch_id - 1
            else logged_offsets(self.checkpoint, batch_id - 1)
        )
        self._last_end = (batch_id, end)
        if not self.python_source:
            return None if start is None else offsets.plan(start, end)
        return offsets.plan(start or {}, end, min_partitions=self.min_partitions)

    def run(
        self, df: Any, batch_id: int, ranges: list[OffsetRange] | None, *, again: bool = False
    ) -> list[TaskFigures]:
        """Process the batch ``df`` (id ``batch_id``) over its planned ``ranges`` (see
        :meth:`plan`); one figure per task that read records. ``again``: the batch was
        processed before (its rejects and poison were sent to the dead-letter topic then)."""
        schema, handler = self.schema, self.handler
        dead = None if again else self.dead_letter
        if self.python_source:
            assert ranges is not None  # plan() raises without them
            if ranges:
                handler.on_tasks(len(ranges))
            bootstrap, isolation, on_poison = self.bootstrap, self.isolation_level, self.on_poison
            kafka_conf = self.kafka_conf  # its path: each executor reads the file itself

            def task(r: OffsetRange) -> TaskFigures:
                skipped = Skipped()
                try:
                    figures = decode_range(
                        read_range(
                            bootstrap,
                            r,
                            isolation_level=isolation,
                            skipped=skipped,
                            on_poison=on_poison,
                            kafka_conf=kafka_conf,
                        ),
                        schema=schema,
                        handler=handler,
                        planned=r,
                        dead_letter=dead,
                    )
                except UnreadableRange as e:
                    # The batch stops at this range; the handler still sees the task, empty,
                    # so that a synchronous round stops waiting for it (else every round of
                    # the other tasks waits out its timeout before the stop).
                    with contextlib.suppress(StreamtrainError, OSError):
                        decode_range(
                            iter(()), schema=schema, handler=handler, planned=r, dead_letter=None
                        )
                    return TaskFigures(r, 0, 0, 0, {}, 0.0, 0.0, None, None, unreadable=str(e))
                figures.aborted, figures.poisoned = skipped.aborted, skipped.poisoned
                figures.poison = [PassedOver(r.topic, r.partition, *p) for p in skipped.poison]
                if figures.poison and dead is not None:  # before the batch commits, as rejects are
                    dead_letters.send_poison(dead, figures.poison)
                return figures

            try:
                done = cluster.run_on_executors(
                    self.spark, ranges, task, description=f"streamtrain batch {batch_id}"
                )
            except Exception as e:
                raise executor_error(e) or e from None
            for f in done:
                if f.unreadable is not None:
                    raise UnreadableRange.from_message(f.unreadable) or StreamtrainError(
                        f.unreadable
                    )
            return done

        # Spark's own source runs one task per partition of its plan, an empty one too (the
        # handler sees it, empty): a synchronous round waits for that many.
        tasks = df.rdd.getNumPartitions()
        if tasks:
            handler.on_tasks(tasks)

        def arrow_task(batches: Iterator[Any]) -> Iterator[Any]:
            import pyarrow as pa

            figures = decode_range(
                batches, schema=schema, handler=handler, planned=None, dead_letter=dead
            )
            # Pickled, as Spark pickles the Python source's task results: a handler's result
            # (its arrays, its dataclasses) comes back as it was, not as JSON lists.
            yield pa.RecordBatch.from_pylist([{"figures": pickle.dumps(figures)}])

        rows = df.mapInArrow(arrow_task, "figures binary").collect()
        figures = (pickle.loads(r["figures"]) for r in rows)
        read = [f for f in figures if f.rows]
        if ranges is not None:
            outside(read, ranges)
        return read


def outside(figures: list[TaskFigures], planned: list[OffsetRange]) -> None:
    """Raise where Spark's own source read records beyond the batch's ``planned`` ranges
    (its offset log): the checkpoint and the records would disagree.

    >>> from pipeline.ingest.decode import TaskFigures as F
    >>> outside([F(OffsetRange("t", 0, 2, 9), 7, 0, 7, {}, 0, 0, 1, None)],
    ...     [OffsetRange("t", 0, 0, 10)])
    """
    for f in figures:
        if not any(
            r.topic_partition == f.range.topic_partition
            and r.start <= f.range.start
            and f.range.end <= r.end
            for r in planned
        ):
            raise StreamtrainError(
                f"Spark's Kafka source read {f.range} in a batch whose offset log says "
                f"{planned}: the query's checkpoint and the records disagree."
            )
