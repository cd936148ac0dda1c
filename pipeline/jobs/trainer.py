"""The batch API: train a Keras model on static data with a distributed algorithm.

For dist-keras users moving over::

    # algorithm's default: "sync", as run
    trainer = Trainer(model, algorithm="adag", num_workers=2, batch_size=128,
                      communication_window=5, num_epoch=1)
    model = trainer.train(dataframe)          # a Spark DataFrame: features + label columns
    model = trainer.train(x, y)               # or numpy arrays

The parameter server runs in this process; workers run in Spark executors (for a
DataFrame) or in local worker processes (for numpy arrays), each keeping a
resident compiled replica between calls.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import dataclasses
import json
import logging
import multiprocessing as mp
import os
import uuid
from typing import Any

import numpy as np

from pipeline import cluster
from pipeline.errors import ConfigError
from pipeline.train import algorithms
from pipeline.train.driver import TrainDriver
from pipeline.train.model import ModelSpec, get_flat, input_shape, set_flat
from pipeline.train.partition import ServerInfo, TaskResult, train_partition
from pipeline.train.ps.protocol import task_key
from pipeline.train.server import Server, parameter_server

log = logging.getLogger(__name__)

_POOL: list[Any] = [None, 0]  # (executor, workers): local worker processes, reused across calls


def _local_pool(workers: int) -> cf.ProcessPoolExecutor:
    pool, size = _POOL
    # A pool with more processes than a job's workers serves it as well: grow, never shrink.
    if pool is None or size < workers:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        # spawn, not fork: the parent may hold TensorFlow, the server's threads and sockets.
        pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
        _POOL[:] = [pool, workers]
    return pool


def shutdown_workers() -> None:
    """Stop the local worker processes (they are reused until then)."""
    pool = _POOL[0]
    if pool is not None:
        pool.shutdown(cancel_futures=True)
    _POOL[:] = [None, 0]


atexit.register(shutdown_workers)


def _train_in_process(kwargs: dict[str, Any]) -> TaskResult:
    return train_partition(**kwargs)


def check_finite(values: np.ndarray, what: str) -> None:
    """Refuse NaN or infinity, which would spread through the weights in one step.

    >>> check_finite(np.array([[1.0, np.nan]]), "features")  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    pipeline.errors.ConfigError: Expected finite features. Received 1 NaN or infinite value(s), the
    first in row 0; fill or drop them (a table's schema does: streamtrain schema infer).
    """
    bad = ~np.isfinite(np.asarray(values, np.float64))
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise ConfigError(
            f"Expected finite {what}. Received {int(bad.sum())} NaN or infinite value(s), the "
            f"first in row {row}; fill or drop them (a table's schema does: streamtrain schema "
            "infer)."
        )


class Trainer:
    """Distributed training of a Keras model on static data.

    Args:
        model: a built Keras model (Sequential, functional, or subclassed with get_config).
        algorithm: a name from :data:`pipeline.train.algorithms.NAMES`, a config dict or an
            instance.
        num_workers, batch_size, communication_window, worker_optimizer, loss: as in
            dist-keras; they override the algorithm's own settings.
        num_epoch: passes over the data.
        features_col, label_col: DataFrame columns (features: array or ML vector).
        host: the address the parameter server binds (default: loopback for local
            runs, the Spark driver's host on a cluster).
        wire_dtype: the payloads' type on TCP: float32, or bfloat16 or float16 for half the
            bytes (the center stays float32; :mod:`pipeline.train.ps.wire`).
        shared_memory: workers on the server's machine exchange through shared memory
            (False: over TCP, as on a cluster).
        ps_shards: parameter-server processes, each serving a slice of the weights
            (:mod:`pipeline.train.sharded`); 1, one server in this process.
        seed: makes a run reproducible (data order; one worker is then deterministic).
        **algorithm_settings: further algorithm settings (``rho``, ``learning_rate``, ...).

    After :meth:`train`, ``results`` holds each worker's figures and ``server_stats``
    the parameter server's.
    """

    def __init__(
        self,
        model: Any,
        *,
        algorithm: str | dict[str, Any] | algorithms.Algorithm = "sync",
        num_workers: int | None = None,
        batch_size: int | None = None,
        communication_window: int | None = None,
        worker_optimizer: str | dict[str, Any] | None = None,
        loss: str | None = None,
        num_epoch: int = 1,
        features_col: str = "features",
        label_col: str = "label",
        host: str | None = None,
        seed: int | None = None,
        wire_dtype: str = "float32",
        shared_memory: bool = True,
        ps_shards: int = 1,
        **algorithm_settings: Any,
    ) -> None:
        given = {
            "num_workers": num_workers,
            "batch_size": batch_size,
            "communication_window": communication_window,
            "worker_optimizer": worker_optimizer,
            "loss": loss,
            "seed": seed,
            **algorithm_settings,
        }
        self.algorithm = algorithms.get(
            algorithm, **{k: v for k, v in given.items() if v is not None}
        )
        if num_epoch < 1:
            raise ConfigError(
                f"Received an invalid value for `num_epoch`, expected a positive integer. "
                f"Received: num_epoch={num_epoch}"
            )
        self.model = model
        self.num_epoch = num_epoch
        self.features_col, self.label_col = features_col, label_col
        self.host = host
        if wire_dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(
                f"Expected wire_dtype float32, bfloat16 or float16. Received: {wire_dtype!r}"
            )
        self.wire_dtype, self.shared_memory = wire_dtype, shared_memory
        if not isinstance(ps_shards, int) or ps_shards < 1:
            raise ConfigError(
                f"Received an invalid value for `ps_shards`, expected a positive integer. "
                f"Received: ps_shards={ps_shards!r}"
            )
        self.ps_shards = ps_shards
        self.spec = ModelSpec.from_model(
            model, optimizer=self.algorithm.worker_optimizer, loss=self.algorithm.loss
        )
        self.results: list[TaskResult] = []
        self.server_stats: dict[str, Any] = {}

    def _server(self, host: str) -> Server:
        # A round waits 10 s at most for a worker whose partition ran out of steps.
        return parameter_server(
            self.algorithm,
            self.spec,
            get_flat(self.model),
            host=host,
            sync_timeout_s=10.0,
            shared_memory=self.shared_memory,
            shards=self.ps_shards,
        )

    def _finish(self, server: Server, results: list[TaskResult]) -> Any:
        self.results = sorted(results, key=lambda r: r.worker)
        TrainDriver(server).check_applied(
            self.results
        )  # Spark may have run a task twice: the server's count decides
        self.server_stats = server.stats()
        set_flat(self.model, server.weights(), self.spec.shapes)
        if getattr(self.model, "optimizer", None) is None:
            # Keras resolves the name or config itself (its compile calls optimizers.get).
            self.model.compile(optimizer=self.algorithm.worker_optimizer, loss=self.algorithm.loss)
        return self.model

    def _task(self, server: Server, worker: int, job: str, threads: int) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "algorithm": algorithms.serialize(self.algorithm),
            "server": ServerInfo.of(server, self.wire_dtype),
            "worker": worker,
            "job": job,
            "epochs": self.num_epoch,
            "threads": threads,
            "seed": self.algorithm.seed,
        }

    def train(self, data: Any, labels: np.ndarray | None = None) -> Any:
        """Train on a Spark DataFrame, or on arrays ``data`` (features) and ``labels``; return the
        model."""
        if labels is not None:
            return self._train_arrays(np.asarray(data), np.asarray(labels))
        if hasattr(data, "sparkSession") and hasattr(data, "mapInArrow"):
            return self._train_dataframe(data)
        raise ConfigError(
            "Expected train(dataframe) with a Spark DataFrame, or train(x, y) with numpy arrays. "
            f"Received: {type(data).__name__}"
        )

    def _train_arrays(self, x: np.ndarray, y: np.ndarray) -> Any:
        if len(x) != len(y):
            raise ConfigError(
                f"Expected as many labels as examples. Received: {len(x)} examples, {len(y)} labels"
            )
        check_finite(x, "features")
        if np.issubdtype(y.dtype, np.floating):
            check_finite(y, "labels")
        workers = self.algorithm.num_workers
        threads = max(1, (os.cpu_count() or 1) // workers)
        job = uuid.uuid4().hex
        with self._server(self.host or "127.0.0.1") as server:
            pool = _local_pool(workers)
            shards = zip(np.array_split(x, workers), np.array_split(y, workers), strict=True)
            futures = [
                pool.submit(
                    _train_in_process, {"x": xs, "y": ys, **self._task(server, w, job, threads)}
                )
                for w, (xs, ys) in enumerate(shards)
            ]
            results = [f.result() for f in futures]
            return self._finish(server, results)

    def _train_dataframe(self, df: Any) -> Any:
        import pyarrow as pa
        from pyspark.sql import functions as F

        spark = df.sparkSession
        missing = [c for c in (self.features_col, self.label_col) if c not in df.columns]
        if missing:
            raise ConfigError(
                f"Expected columns {missing} in the DataFrame. Received columns: {df.columns}. "
                "Pass features_col= / label_col=."
            )
        features = F.col(self.features_col)
        if "vector" in df.schema[self.features_col].dataType.simpleString().lower():
            from pyspark.ml.functions import vector_to_array

            features = vector_to_array(features, "float32")
        workers = self.algorithm.num_workers
        frame = df.select(
            features.cast("array<float>").alias("x"), F.col(self.label_col).alias("y")
        ).repartition(workers)
        host = self.host or cluster.driver_host(spark)
        threads = cluster.task_threads(spark, workers)
        job = uuid.uuid4().hex
        shape = input_shape(self.model)

        with self._server(host) as server:
            task = self._task(server, 0, job, threads)

            def train_arrow(batches: Any) -> Any:
                from pyspark import TaskContext

                xs, ys = [], []
                for b in batches:
                    xs.append(
                        np.asarray(b.column(0).flatten(), np.float32).reshape((len(b), *shape))
                    )
                    ys.append(np.asarray(b.column(1)))
                x = np.concatenate(xs) if xs else np.empty((0, *shape), np.float32)
                y = np.concatenate(ys) if ys else np.empty(0, np.int64)
                ctx = TaskContext.get()
                part = ctx.partitionId() if ctx else 0
                # Named by the job and partition, each attempt Spark makes at it draws the same
                # mini-batches, and the server applies each exchange once (a retry skips ahead).
                result = train_partition(
                    x,
                    y,
                    **{
                        **task,
                        "worker": part,
                        "task": task_key(job, part, 0),
                        "attempt": ctx.attemptNumber() if ctx else 0,
                        "seed": (task["seed"] or int(job[:8], 16), part),
                    },
                )
                yield pa.RecordBatch.from_pylist(
                    [{"result": json.dumps(dataclasses.asdict(result))}]
                )

            rows = frame.mapInArrow(train_arrow, "result string").collect()
            results = [TaskResult(**json.loads(r["result"])) for r in rows]
            return self._finish(server, results)
