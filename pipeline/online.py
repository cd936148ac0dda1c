"""Online training: the stream handler that trains each decoded block through the parameter server."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from pipeline import stream
from pipeline.model import ModelSpec
from pipeline.worker import ServerInfo, train_partition


@dataclasses.dataclass
class TrainHandler(stream.Handler):
    """Trains every block on an executor's resident replica; the driver half checkpoints.

    Attributes:
        spec: the model.
        algorithm: the serialized algorithm (``algorithms.serialize``).
        server: how to reach the parameter server.
        job: the run's id (a new id resets the replicas' optimizer state).
        threads: TensorFlow threads per task.
        seed: with a seed, each block's shuffle follows from it and the block's first
            offset, so a batch replayed after a crash trains in the same order.
        driver: the driver's half (checkpoint, metrics, evaluation): an object with
            ``on_tasks(n)``, ``on_batch(info)`` and ``skip(batch_id)``; never shipped to executors.
    """

    spec: ModelSpec
    algorithm: dict[str, Any]
    server: ServerInfo
    job: str
    threads: int = 1
    seed: int | None = None
    driver: Any = dataclasses.field(default=None, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        # The driver half holds the parameter server, locks and Spark: never ship it.
        return {**self.__dict__, "driver": None}

    def process(self, block: stream.Block) -> dict[str, Any]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        worker = ctx.partitionId() if ctx else block.partition
        x = block.schema.to_model_input(block.x)
        first = int(block.offsets[0]) if len(block.offsets) else 0
        result = train_partition(
            x, block.y, spec=self.spec, algorithm=self.algorithm, server=self.server, worker=worker,
            job=self.job, threads=self.threads,
            seed=None if self.seed is None else (self.seed, block.partition, first),
        )
        now_ms = time.time() * 1000
        freshness = (now_ms - block.timestamps_ms) / 1000 if len(block.timestamps_ms) else np.zeros(0)
        figures = dataclasses.asdict(result)
        figures["freshness_s"] = [float(np.percentile(freshness, q)) for q in (50, 99)] if len(freshness) else []
        return figures

    def on_tasks(self, n: int) -> None:
        if self.driver is not None:
            self.driver.on_tasks(n)

    def on_batch(self, info: stream.BatchInfo) -> None:
        if self.driver is not None:
            self.driver.on_batch(info)

    def skip(self, batch_id: int) -> bool:
        return bool(self.driver is not None and self.driver.skip(batch_id))
