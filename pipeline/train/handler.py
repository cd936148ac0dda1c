"""Online training: the stream handler that trains each decoded block through the parameter
server."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline import config
from pipeline.ingest import microbatch
from pipeline.ingest.batch_figures import BatchFigures
from pipeline.ingest.decode import Block
from pipeline.ingest.offsets import OffsetRange
from pipeline.train.drift import SAMPLE_ROWS
from pipeline.train.model import ModelSpec
from pipeline.train.partition import ServerInfo, TaskResult, train_partition
from pipeline.train.ps.protocol import task_key

if TYPE_CHECKING:
    from pipeline.train.driver import TrainDriver


@dataclasses.dataclass
class TrainHandler(microbatch.Handler):
    """Trains every block on an executor's resident replica; on the driver, its
    :class:`~pipeline.train.driver.TrainDriver` checkpoints each batch exactly once.

    Attributes:
        spec: the model.
        algorithm: the serialized algorithm (``algorithms.serialize``).
        server: how to reach the parameter server.
        job: the run's id (a new id resets the replicas' optimizer state).
        threads: TensorFlow threads per task.
        seed: each block's shuffle follows from it (None: from ``job``) and the block's
            first offset, so a batch replayed after a crash, and a task Spark runs again,
            train in the same order.
        driver: the exactly-once driver; never shipped to executors.
        holdout_every: after a drift, one record in this many (by offset) is held out of
            training and sent back for the held-out window (0: none; :mod:`pipeline.train.adapt`).
        lr_scale: multiplies the replicas' learning rate (raised for a while after a drift).
        passes: how many times each task trains its records (more than one for a while after
            a drift; the prequential score is the first pass's).
        replay: > 0 while the batch a drift showed up in is trained again (its tasks are tasks
            of their own for the server, and send back no description for the drift signals).
    """

    spec: ModelSpec
    algorithm: dict[str, Any]
    server: ServerInfo
    job: str
    threads: int = 1
    seed: int | None = None
    driver: TrainDriver | None = dataclasses.field(default=None, repr=False)
    holdout_every: int = 0
    lr_scale: float = 1.0
    passes: int = 1
    replay: int = 0

    def __getstate__(self) -> dict[str, Any]:
        # The driver holds the parameter server and its locks: never ship it.
        return {**self.__dict__, "driver": None}

    def process(self, block: Block) -> TaskResult:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        worker = ctx.partitionId() if ctx else block.partition
        first = int(block.offsets[0]) if len(block.offsets) else 0
        seed = int(self.job[:8], 16) if self.seed is None else self.seed
        x, y, held = block.x, block.y, None
        if self.holdout_every:  # by offset: a retried task holds out the same records
            mask = block.offsets % self.holdout_every == 0
            held, x, y = (x[mask], y[mask]), x[~mask], y[~mask]
        layout = _layout(block.schema)
        result = train_partition(
            block.schema.to_model_input(x),
            y,
            spec=self.spec,
            algorithm=self.algorithm,
            server=self.server,
            worker=worker,
            job=self.job,
            threads=self.threads,
            seed=(seed, block.partition, first),
            task=task_key(block.topic, block.partition, first, replay=self.replay),
            attempt=ctx.attemptNumber() if ctx else 0,
            after_exchange=_fault_after,
            lr_scale=self.lr_scale,
            epochs=self.passes,
            layout=layout,
            sightings=not self.replay,
        )
        # The stream's records, each once however many passes trained them (the steps count
        # the passes): what the ledger, the drift signals and the rates count.
        if not result.diverged:
            result.records = len(y)
        if not self.replay:  # a replay's records were described when the stream trained them
            _describe(result, block.schema, x, y, held, layout)
        return result

    def on_tasks(self, n: int) -> None:
        if self.driver is not None:
            self.driver.on_tasks(n)

    def on_batch(self, info: BatchFigures) -> None:
        if self.driver is not None:
            self.driver.on_batch(info)

    def skip(self, batch_id: int, ranges: list[OffsetRange] | None) -> bool:
        return bool(self.driver is not None and self.driver.skip(batch_id, ranges))


def _describe(
    result: TaskResult,
    schema: Any,
    x: np.ndarray,
    y: np.ndarray,
    held: tuple[np.ndarray, np.ndarray] | None,
    layout: Any = None,
) -> None:
    """What the driver's drift signals read besides the losses: the class counts, a sample
    of a table's features (images have no per-column meaning, an ID's key no quantity), the
    held-out records."""
    if schema.num_classes > 1 and not schema.regression and len(y):
        result.label_counts = np.bincount(y.astype(np.int64), minlength=schema.num_classes)[
            : schema.num_classes
        ].tolist()
    if schema.dtype == "float32" and len(x):
        result.sample_x = x[:: max(1, len(x) // SAMPLE_ROWS)][:SAMPLE_ROWS]
        if layout is not None:  # keys are no quantity: their lanes are left out as constants
            result.sample_x = result.sample_x.copy()
            for c in layout.columns:
                result.sample_x[:, c.lane : c.lane + 3] = 0.0
    if held is not None and result.diverged is None:
        result.heldout_x, result.heldout_y = held
        result.held_out = len(held[1])


def _layout(schema: Any) -> Any:
    """Where a table's ID features are (None: it has none)."""
    table = getattr(schema, "table", None)
    if table is None or not table.ids:
        return None
    from pipeline.table.ids import IdLayout

    return IdLayout(table)


def _fault_after(exchange: int) -> None:
    """Fault injection for the task-retry tests, in an executor's Python worker:
    ``STREAMTRAIN_FAULT=exchange:<k>:<python|executor>:<marker file>`` SIGKILLs, after a
    task's k-th exchange, the Python worker itself or the executor JVM it belongs to;
    once per run (the first task there creates the marker, with the pid it killed)."""
    wanted = config.settings().fault or ""
    parts = wanted.split(":", 3)
    if len(parts) != 4 or parts[0] != "exchange" or parts[1] != str(exchange):
        return
    victim = os.getpid() if parts[2] == "python" else _executor_jvm()
    try:
        fd = os.open(parts[3], os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    os.write(fd, f"{victim}\n".encode())
    os.close(fd)
    os.kill(victim, signal.SIGKILL)


def _executor_jvm() -> int:
    """The pid of the executor JVM this Python worker runs under (its nearest ancestor
    running ``CoarseGrainedExecutorBackend``, Spark's executor on a cluster)."""
    pid = os.getppid()
    while pid > 1:
        with contextlib.suppress(OSError):
            if b"CoarseGrainedExecutorBackend" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    raise RuntimeError(
        "fault injection: no executor JVM above this Python worker (local mode has none)"
    )
