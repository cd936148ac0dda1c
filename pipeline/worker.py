"""The executor side: a resident Keras replica that trains a partition and talks to the server.

Importing TensorFlow and building a model costs seconds, a weight exchange
milliseconds, so each Python worker process keeps one compiled replica per model
fingerprint (a module-level cache: best-effort, since Spark reaps idle Python
workers) and only swaps weights.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from typing import Any

import numpy as np

from pipeline import algorithms
from pipeline.model import ModelSpec, get_flat, input_shape, reset_optimizer, set_flat

#: fingerprint -> (compiled replica, the job it last trained for)
_REPLICAS: dict[str, list[Any]] = {}


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    """How a worker reaches the parameter server (the secret travels in Spark's task, never logged)."""

    host: str
    port: int
    secret: bytes = dataclasses.field(repr=False)


@dataclasses.dataclass
class PartitionResult:
    """What one worker did with one partition."""

    worker: int
    records: int
    steps: int
    exchanges: int
    loss_first: float
    loss_last: float
    staleness: list[int]
    compute_s: float
    exchange_s: float
    fresh_replica: bool
    preq_n: int = 0
    preq_loss: float = float("nan")
    preq_acc: float = float("nan")


def init_tensorflow(threads: int) -> None:
    """Limit TensorFlow to ``threads`` cores (before its first use in this process)."""
    if "tensorflow" not in sys.modules:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        os.environ["TF_NUM_INTRAOP_THREADS"] = str(threads)
        os.environ["TF_NUM_INTEROP_THREADS"] = "1"
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        pass  # already initialized in this process: the first setting stays


def replica(spec: ModelSpec, *, job: str, threads: int = 1) -> tuple[Any, bool]:
    """The cached compiled replica for ``spec`` (built if new); a new ``job`` resets its optimizer.

    Returns the model and whether it was built now.
    """
    init_tensorflow(threads)
    entry = _REPLICAS.get(spec.fingerprint)
    if entry is None:
        entry = _REPLICAS[spec.fingerprint] = [spec.build(), job]
        return entry[0], True
    if entry[1] != job:
        reset_optimizer(entry[0])
        entry[1] = job
    return entry[0], False


def _one_hot_if_needed(loss: str, y: np.ndarray, classes: int) -> np.ndarray:
    if loss == "categorical_crossentropy" and y.ndim == 1:
        return np.eye(classes, dtype=np.float32)[y]
    return y


def train_partition(
    x: np.ndarray,
    y: np.ndarray,
    *,
    spec: ModelSpec,
    algorithm: dict[str, Any],
    server: ServerInfo,
    worker: int,
    job: str,
    epochs: int = 1,
    threads: int = 1,
    seed: int | None = None,
    prequential: int = 0,
) -> PartitionResult:
    """Train on one partition's ``x``/``y`` with the algorithm's exchanges; report figures.

    The replica starts from the server's center, exchanges every
    ``communication_window`` mini-batches, and once more at the end so that no
    step is lost. With ``prequential`` > 0 it first scores the center on up to that
    many of the partition's records before training on them (test-then-train).
    """
    from pipeline import ps

    algo = algorithms.get(algorithm)
    model, fresh = replica(spec, job=job, threads=threads)
    classes = spec.shapes[-1][-1]  # the output layer's bias; subclassed models have no .outputs
    y = _one_hot_if_needed(spec.loss, y, classes)
    shape = input_shape(model)
    if x.shape[1:] != shape:
        x = x.reshape((len(x), *shape))
    rng = np.random.default_rng(None if seed is None else [seed, worker])
    batch, window = algo.batch_size, algo.communication_window
    n = len(x)
    steps_per_epoch = math.ceil(n / batch) if n else 0
    losses: list[float] = []
    staleness: list[int] = []
    compute_s = exchange_s = 0.0
    exchanges = 0
    with ps.Client((server.host, server.port), secret=server.secret, worker=worker, size=spec.size) as client:
        started = time.perf_counter()
        pulled = client.pull().copy()
        set_flat(model, pulled, spec.shapes)
        exchange_s += time.perf_counter() - started
        preq = _score(model, x[:prequential], y[:prequential]) if prequential and n else (0, float("nan"), float("nan"))
        step = 0
        for _ in range(epochs):
            order = rng.permutation(n) if seed is not None or epochs > 1 else np.arange(n)
            for s in range(steps_per_epoch):
                idx = order[s * batch : (s + 1) * batch]
                started = time.perf_counter()
                loss = model.train_on_batch(x[idx], y[idx])
                compute_s += time.perf_counter() - started
                losses.append(float(loss[0] if isinstance(loss, list | tuple) else loss))
                step += 1
                last = step == epochs * steps_per_epoch
                if step % window == 0 or last:
                    started = time.perf_counter()
                    local = get_flat(model)
                    set_flat(model, algo.exchange(client, local, pulled), spec.shapes)
                    staleness.append(client.last_staleness)
                    exchange_s += time.perf_counter() - started
                    exchanges += 1
    head = losses[: min(10, len(losses))] or [float("nan")]
    tail = losses[-min(10, len(losses)) :] or [float("nan")]
    return PartitionResult(
        worker=worker, records=n * epochs, steps=len(losses), exchanges=exchanges,
        loss_first=float(np.mean(head)), loss_last=float(np.mean(tail)), staleness=staleness,
        compute_s=compute_s, exchange_s=exchange_s, fresh_replica=fresh,
        preq_n=preq[0], preq_loss=preq[1], preq_acc=preq[2],
    )


def _score(model: Any, x: np.ndarray, y: np.ndarray) -> tuple[int, float, float]:
    """(n, cross-entropy, accuracy) of a classifier on ``x``/``y`` (labels or one-hot)."""
    probs = np.asarray(model.predict_on_batch(x), np.float64)
    labels = y.argmax(axis=1) if y.ndim == 2 else y.astype(np.int64)
    if probs.ndim != 2 or probs.shape[1] < 2:
        return len(x), float("nan"), float("nan")
    picked = np.clip(probs[np.arange(len(x)), labels], 1e-7, 1.0)
    return len(x), float(-np.log(picked).mean()), float((probs.argmax(axis=1) == labels).mean())
