"""Online training: the stream handler that trains each decoded block through the parameter server."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from pipeline.ingest import microbatch
from pipeline.ingest.decode import Block
from pipeline.ingest.offsets import OffsetRange
from pipeline.train.model import ModelSpec
from pipeline.train.partition import PartitionResult, ServerInfo, train_partition


class DriverHalf(Protocol):
    """What the online job does on the driver around each micro-batch (checkpoint, metrics)."""

    def on_tasks(self, n: int) -> None: ...

    def on_batch(self, info: microbatch.BatchInfo) -> None: ...

    def skip(self, batch_id: int, ranges: list[OffsetRange] | None) -> bool: ...


@dataclasses.dataclass
class TrainHandler(microbatch.Handler):
    """Trains every block on an executor's resident replica; the driver half checkpoints.

    Attributes:
        spec: the model.
        algorithm: the serialized algorithm (``algorithms.serialize``).
        server: how to reach the parameter server.
        job: the run's id (a new id resets the replicas' optimizer state).
        threads: TensorFlow threads per task.
        seed: with a seed, each block's shuffle follows from it and the block's first
            offset, so a batch replayed after a crash trains in the same order.
        driver: the driver's half; never shipped to executors.
    """

    result_type = PartitionResult

    spec: ModelSpec
    algorithm: dict[str, Any]
    server: ServerInfo
    job: str
    threads: int = 1
    seed: int | None = None
    driver: DriverHalf | None = dataclasses.field(default=None, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        # The driver half holds the parameter server, locks and Spark: never ship it.
        return {**self.__dict__, "driver": None}

    def process(self, block: Block) -> PartitionResult:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        worker = ctx.partitionId() if ctx else block.partition
        first = int(block.offsets[0]) if len(block.offsets) else 0
        return train_partition(
            block.schema.to_model_input(block.x), block.y, spec=self.spec, algorithm=self.algorithm,
            server=self.server, worker=worker, job=self.job, threads=self.threads,
            seed=None if self.seed is None else (self.seed, block.partition, first),
        )

    def on_tasks(self, n: int) -> None:
        if self.driver is not None:
            self.driver.on_tasks(n)

    def on_batch(self, info: microbatch.BatchInfo) -> None:
        if self.driver is not None:
            self.driver.on_batch(info)

    def skip(self, batch_id: int, ranges: list[OffsetRange] | None) -> bool:
        return bool(self.driver is not None and self.driver.skip(batch_id, ranges))
