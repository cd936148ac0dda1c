"""Ingest: from Kafka to decoded blocks on the executors.

* :mod:`~pipeline.ingest.kafka`: Kafka clients, the raw Fetch reader, the embedded broker.
* :mod:`~pipeline.ingest.offsets`: the one offset planner (ranges per micro-batch).
* :mod:`~pipeline.ingest.sources` and :mod:`~pipeline.ingest.spark_source`: Kafka into
  Spark Structured Streaming (Spark's source, or streamtrain's Python data source).
* :mod:`~pipeline.ingest.reader`: one range, read on an executor, as Arrow.
* :mod:`~pipeline.ingest.decode` and :mod:`~pipeline.ingest.dead_letters`: wire format to
  numpy, rejects set aside.
* :mod:`~pipeline.ingest.lag`: consumer lag.
* :mod:`~pipeline.ingest.microbatch`: the micro-batch driver and its :class:`Handler`;
  :mod:`~pipeline.ingest.batch_figures`: what a batch's tasks add up to.
* :mod:`~pipeline.ingest.stopping`: a query stopped between a batch's commit and the next.

Importing the package is cheap (producers use its Kafka helpers): the names below load
their module, and with it Spark, on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline import exports

if TYPE_CHECKING:
    from pipeline.ingest.batch_figures import BatchFigures
    from pipeline.ingest.decode import Block, TaskFigures
    from pipeline.ingest.microbatch import Handler, StreamJob
    from pipeline.ingest.offsets import OffsetRange

_EXPORTS = {
    "BatchFigures": "pipeline.ingest.batch_figures",
    "Handler": "pipeline.ingest.microbatch",
    "StreamJob": "pipeline.ingest.microbatch",
    "Block": "pipeline.ingest.decode",
    "TaskFigures": "pipeline.ingest.decode",
    "OffsetRange": "pipeline.ingest.offsets",
}


__getattr__ = exports.lazy(__name__, _EXPORTS)


__all__ = ["BatchFigures", "Block", "Handler", "OffsetRange", "TaskFigures", "StreamJob"]
