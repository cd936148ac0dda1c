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
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline import algorithms
from pipeline.model import (
    FlatGradients,
    FlatWeights,
    ModelSpec,
    input_shape,
    reset_optimizer,
    set_flat,
)


@dataclasses.dataclass
class Replica:
    """A resident compiled model, the job it last trained for, and its flat views."""

    model: Any
    job: str
    weights: FlatWeights
    spec: ModelSpec
    _gradients: FlatGradients | None = None

    @property
    def gradients(self) -> FlatGradients:
        """The flat-gradient function (built on first use: only synchronous SGD needs it)."""
        if self._gradients is None:
            self._gradients = FlatGradients(self.model, self.spec)
        return self._gradients


#: model fingerprint -> its replica in this process
_REPLICAS: dict[str, Replica] = {}


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


def replica(spec: ModelSpec, *, job: str, threads: int = 1, prime_batch: int = 0,
            gradients: bool = False) -> tuple[Replica, bool]:
    """The cached compiled replica for ``spec`` (built if new); a new ``job`` resets its optimizer.

    With ``prime_batch`` > 0 a new replica is also traced (see :func:`prime`): its
    gradient function if ``gradients`` (synchronous SGD), else its train function.
    Returns the replica and whether it was built now.
    """
    init_tensorflow(threads)
    entry = _REPLICAS.get(spec.fingerprint)
    if entry is None:
        model = spec.build()
        entry = _REPLICAS[spec.fingerprint] = Replica(model, job, FlatWeights(model, spec.shapes), spec)
        if prime_batch:
            prime(entry, prime_batch, gradients=gradients)
        return entry, True
    if entry.job != job:
        reset_optimizer(entry.model)
        entry.job = job
    return entry, False


def prime(entry: Replica, batch: int, *, gradients: bool = False) -> None:
    """Trace the replica's train function (or its gradient function) on zeros, then forget
    those steps.

    TensorFlow traces a function on its first call (about a second for the MNIST
    CNN) and once more for the first batch of another size (a partition's last,
    short batch); done here, in the warm-up, the first micro-batch trains at full
    speed. The weights it changes are replaced by the first pull, and the
    optimizer state it creates is zeroed.
    """
    model, spec = entry.model, entry.spec
    shape = input_shape(model)
    x = np.zeros((batch, *shape), np.float32)
    if spec.loss.startswith("sparse"):
        y = np.zeros(batch, np.int32)
    else:  # targets shaped like the outputs
        y = np.zeros((batch, *np.shape(model.predict_on_batch(x[:1]))[1:]), np.float32)
    if gradients:
        entry.gradients(x, y)  # traced for any batch size at once
        return
    for n in (batch, 1, batch):
        model.train_on_batch(x[:n], y[:n])
    reset_optimizer(model)


def _labels(loss: str, y: np.ndarray, classes: int) -> np.ndarray:
    """Labels in the one form the replica's traced train function takes (another dtype
    would make TensorFlow trace it again)."""
    if loss == "categorical_crossentropy" and y.ndim == 1:
        return np.eye(classes, dtype=np.float32)[y]
    return y.astype(np.int32 if loss.startswith("sparse") else np.float32, copy=False)


class _GradientPusher:
    """Synchronous SGD's side of a partition: mean gradients out, the center back, one step behind.

    A window's mean gradient is pushed from a background thread, and the next
    window computes meanwhile on the weights the replica has, so the exchange (the
    round's wait for the other workers, the server's optimizer step, 8 MB through
    shared memory or the socket) costs nothing but the load of the new center
    before the window after.
    The price is one round of staleness: a gradient is applied to a center one
    round newer than the weights it was computed on (recorded per push).
    """

    def __init__(self, client: Any, algo: algorithms.Algorithm, entry: Replica, pulled: np.ndarray) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.client, self.algo, self.weights, self.pulled = client, algo, entry.weights, pulled
        self.gradients = entry.gradients
        self.summed: np.ndarray | None = None
        self.count = 0
        # Weights that gradients do not train (batch-norm statistics) send their change instead.
        self.averaged = entry.spec.untrained()
        self.base = pulled[self.averaged] if self.averaged is not None else None
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="streamtrain-push")
        self.pending: tuple[Any, int] | None = None
        self.weights_clock = client.clock  # the center the replica's weights came from
        self.staleness: list[int] = []

    def compute(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        grad, loss, acc = self.gradients(x, y)
        # Each window sums into a new buffer: the last one may still be in flight.
        self.summed = grad if self.summed is None else np.add(self.summed, grad, out=None if self.count == 1 else self.summed)
        self.count += 1
        return loss, acc

    def push(self) -> None:
        assert self.summed is not None
        mean = self.summed if self.count == 1 else np.multiply(self.summed, np.float32(1.0 / self.count), out=self.summed)
        self.summed, self.count = None, 0
        if self.averaged is not None:
            mean = np.array(mean)  # writable
            mean[self.averaged] = self.weights.get()[self.averaged] - self.base
        computed_at = self.weights_clock
        self._finish()
        future = self.pool.submit(self.algo.exchange, self.client, mean, self.pulled)
        self.pending = (future, computed_at)

    def _finish(self) -> None:
        """Wait for the push in flight and continue from the center it brought back."""
        if self.pending is None:
            return
        future, computed_at = self.pending
        self.pending = None
        center = future.result()
        self.weights.set(center)
        if self.averaged is not None:
            self.base = center[self.averaged]
        # The round applied it at clock - 1; its gradient was computed on the center of computed_at.
        self.staleness.append(max(0, self.client.clock - 1 - computed_at))
        self.weights_clock = self.client.clock

    def close(self) -> None:
        try:
            self._finish()
        finally:
            self.pool.shutdown(wait=True)


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
    seed: int | Sequence[int] | None = None,
) -> PartitionResult:
    """Train on one partition's ``x``/``y`` with the algorithm's exchanges; report figures.

    The replica starts from the server's center, exchanges every
    ``communication_window`` mini-batches, and once more at the end so that no
    step is lost. With an algorithm that pushes gradients (synchronous SGD) the
    replica only computes them, and each push travels while the next window
    computes (see :class:`_GradientPusher`). The prequential (test-then-train) loss
    and accuracy come free from the first pass: each step's loss and accuracy are
    those of its forward pass, on weights that have not yet seen that mini-batch.
    """
    from pipeline import ps

    algo = algorithms.get(algorithm)
    entry, fresh = replica(spec, job=job, threads=threads)
    model, weights = entry.model, entry.weights
    classes = spec.shapes[-1][-1]  # the output layer's bias; subclassed models have no .outputs
    y = _labels(spec.loss, y, classes)
    shape = input_shape(model)
    if x.shape[1:] != shape:
        x = x.reshape((len(x), *shape))
    # Mini-batches are drawn in a fresh random order each epoch, as model.fit does: a
    # stream repeats the producer's order (every epoch of a replay is the same), and
    # always seeing the same neighbours costs accuracy. ``seed`` makes it repeatable.
    rng = np.random.default_rng(None if seed is None else [*np.atleast_1d(seed).tolist(), worker])
    batch, window = algo.worker_batch_size, algo.communication_window
    n = len(x)
    steps_per_epoch = math.ceil(n / batch) if n else 0
    losses: list[float] = []
    preq = np.zeros(3)  # records, summed loss, summed accuracy over the first pass
    staleness: list[int] = []
    compute_s = exchange_s = 0.0
    exchanges = 0
    with ps.Client((server.host, server.port), secret=server.secret, worker=worker, size=spec.size) as client:
        started = time.perf_counter()
        pulled = client.pull().copy()
        weights.set(pulled)
        exchange_s += time.perf_counter() - started
        pusher = _GradientPusher(client, algo, entry, pulled) if algo.pushes_gradients else None
        step = 0
        for epoch in range(epochs):
            order = rng.permutation(n)
            for s in range(steps_per_epoch):
                idx = order[s * batch : (s + 1) * batch]
                started = time.perf_counter()
                if pusher is None:
                    out = model.train_on_batch(x[idx], y[idx])
                    loss, acc = (out[0], out[1]) if isinstance(out, list | tuple) else (out, float("nan"))
                else:
                    loss, acc = pusher.compute(x[idx], y[idx])
                compute_s += time.perf_counter() - started
                losses.append(float(loss))
                if epoch == 0:
                    preq += (len(idx), float(loss) * len(idx), float(acc) * len(idx))
                step += 1
                last = step == epochs * steps_per_epoch
                if step % window == 0 or last:
                    started = time.perf_counter()
                    if pusher is None:
                        weights.set(algo.exchange(client, weights.get(), pulled))
                        staleness.append(client.last_staleness)
                    else:
                        pusher.push()
                    exchange_s += time.perf_counter() - started
                    exchanges += 1
        if pusher is not None:
            started = time.perf_counter()
            pusher.close()
            staleness += pusher.staleness
            exchange_s += time.perf_counter() - started
    head = losses[: min(10, len(losses))] or [float("nan")]
    tail = losses[-min(10, len(losses)) :] or [float("nan")]
    return PartitionResult(
        worker=worker, records=n * epochs, steps=len(losses), exchanges=exchanges,
        loss_first=float(np.mean(head)), loss_last=float(np.mean(tail)), staleness=staleness,
        compute_s=compute_s, exchange_s=exchange_s, fresh_replica=fresh,
        preq_n=int(preq[0]), preq_loss=float(preq[1] / preq[0]) if preq[0] else float("nan"),
        preq_acc=float(preq[2] / preq[0]) if preq[0] else float("nan"),
    )



def predict(spec: ModelSpec, weights: np.ndarray, x: np.ndarray, *, job: str, threads: int = 1,
            chunk: int = 1000) -> np.ndarray:
    """The model's outputs on ``x`` with ``weights``, scored on this worker's resident replica.

    The replica's own weights are overwritten; its next partition starts with a pull
    anyway. Its optimizer state is left alone.
    """
    entry, _ = replica(spec, job=job, threads=threads)
    entry.weights.set(np.asarray(weights, np.float32))
    model = entry.model
    shape = input_shape(model)
    x = x.reshape((len(x), *shape))
    return np.concatenate([np.asarray(model.predict_on_batch(x[i : i + chunk])) for i in range(0, len(x), chunk)])


def model_file(spec: ModelSpec, weights: np.ndarray) -> bytes:
    """A ``.keras`` file of the model with ``weights``: a fresh, uncompiled model, not a
    replica with its optimizer state."""
    import tempfile

    model = spec.build(compile=False)
    set_flat(model, np.asarray(weights, np.float32), spec.shapes)  # once: not worth tracing a function
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        with open(path, "rb") as f:
            return f.read()
