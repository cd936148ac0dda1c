"""A micro-batch's figures: what its tasks' :class:`~pipeline.ingest.decode.TaskFigures` add
up to, handed to :meth:`Handler.on_batch <pipeline.ingest.microbatch.Handler.on_batch>` and on
to the trained batch's row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from pipeline.ingest import offsets
from pipeline.ingest.decode import TaskFigures
from pipeline.ingest.offsets import OffsetRange, PassedOver, TopicPartition


@dataclasses.dataclass
class BatchFigures:
    """Figures of one micro-batch.

    ``ranges`` are the ``[start, end)`` of every Kafka partition the batch covered
    (the tasks' ranges merged); ``lag`` is log-end minus ``end`` per topic partition
    when the batch finished; ``aborted`` counts the records of aborted transactions its
    ranges held, not read (read_committed); ``results`` are what the handler
    returned for each task; ``trigger_to_handler_s`` (from Spark's progress report)
    is filled in once the query reports it.
    """

    batch_id: int
    ranges: list[OffsetRange]
    rows: int = 0
    bytes: int = 0
    accepted: int = 0
    rejects: dict[str, int] = dataclasses.field(default_factory=dict)
    aborted: int = 0
    poisoned: int = 0
    poison: list[PassedOver] = dataclasses.field(
        default_factory=list
    )  # unreadable batches passed over
    decode_s: float = 0.0
    handler_s: float = 0.0
    batch_s: float = 0.0
    lag: dict[TopicPartition, int] = dataclasses.field(default_factory=dict)
    trigger_to_handler_s: float | None = None
    results: list[Any] = dataclasses.field(default_factory=list)
    newest_ms: dict[TopicPartition, int] = dataclasses.field(
        default_factory=dict
    )  # per partition, for freshness
    started_at: float = 0.0  # time.monotonic() when the batch reached the driver
    again: Callable[[], list[TaskFigures]] | None = dataclasses.field(
        default=None, repr=False, compare=False
    )

    @classmethod
    def gather(
        cls, batch_id: int, figures: list[TaskFigures], *, started_at: float
    ) -> BatchFigures:
        """Add up the tasks' figures."""
        info = cls(
            batch_id, offsets.merge_ranges([f.range for f in figures]), started_at=started_at
        )
        for f in figures:
            info.rows += f.rows
            info.bytes += f.bytes
            info.accepted += f.accepted
            info.aborted += f.aborted
            info.poisoned += f.poisoned
            info.poison += f.poison
            info.decode_s += f.decode_s
            info.handler_s += f.handler_s
            for reason, n in f.rejects.items():
                info.rejects[reason] = info.rejects.get(reason, 0) + n
            info.results.append(f.result)
            if f.newest_ms is not None:
                tp = f.range.topic_partition
                info.newest_ms[tp] = max(f.newest_ms, info.newest_ms.get(tp, f.newest_ms))
        return info
