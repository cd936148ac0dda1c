"""Synchronous SGD: data parallelism with one optimizer, on the parameter server.

Worker: compute the gradient of ``communication_window`` mini-batches (their
mean, at fixed weights; a window of 1 is one mini-batch), push it, and continue
from the center the server sends back. The replica never steps an optimizer.
By default each gradient is computed on the center of the round before it, as one
process computes on the weights of its last step; with ``overlap`` the push travels
while the next window computes, which hides the exchange's time but lands every
gradient one round late, so that window computes on a prediction of the center its
gradient will meet (the center plus the last step's change; ``bench/ablation.py``
measures what each costs in records).
Server: a round collects one gradient from every worker in it, and applies
their mean with the optimizer (``worker_optimizer``'s rule, Keras's Adam or SGD
run in NumPy) once.

``batch_size`` is the whole round's mini-batch, split among the workers (as
``tf.distribute`` splits a global batch): each computes its gradient on
``batch_size / num_workers`` records, and a round steps the optimizer once on
their mean, as one process would with ``batch_size``. Asynchronous algorithms
trade that for never waiting, and need more records to reach an accuracy. A worker whose partition
runs out leaves the rounds; the others go on without it. Weights that are not trained by gradients
(batch-norm statistics) are averaged instead: their slots carry the change since the last pull.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.train.algorithms import optimizers
from pipeline.train.algorithms.base import Algorithm, ExchangeClient
from pipeline.train.algorithms.worker_half import WorkerHalf

if TYPE_CHECKING:
    from pipeline.train.model import ModelSpec


@dataclasses.dataclass
class SyncSGD(Algorithm):
    """Synchronous data-parallel SGD with the optimizer on the server.

    Example:
        >>> import numpy as np
        >>> algo = SyncSGD(worker_optimizer={"class_name": "SGD", "config": {"learning_rate": 0.5}})
        >>> center = np.ones(2, np.float32)
        >>> algo.apply(center, np.array([1.0, 2.0], np.float32)); center.tolist()
        [0.5, 0.0]
    """

    name = "sync"
    synchronous = True
    pushes_gradients = True
    communication_window: int = 1
    #: Push each window's gradient while the next computes, on the predicted center (one
    #: round of staleness, compensated).
    overlap: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        optimizers.get(
            self.worker_optimizer, 0
        )  # an optimizer the server cannot run fails here, not mid-run
        self._optimizer: optimizers.ServerOptimizer | None = None
        self._averaged: np.ndarray | None = None  # slots of weights not trained by gradients

    @property
    def worker_batch_size(self) -> int:
        """``batch_size`` split among the workers.

        >>> SyncSGD(batch_size=128, num_workers=2).worker_batch_size
        64
        """
        return max(1, round(self.batch_size / self.num_workers))

    def bind(self, spec: ModelSpec) -> None:
        self._optimizer = optimizers.get(self.worker_optimizer, spec.size)
        self._averaged = spec.untrained()

    def worker(self, client: ExchangeClient, replica: Any, pulled: np.ndarray) -> WorkerHalf:
        """Gradients out, the center back (with ``overlap``, in flight while the next window
        computes)."""
        return GradientWorker(self, client, replica, pulled)

    def exchange(self, client: ExchangeClient, local: np.ndarray, pulled: np.ndarray) -> np.ndarray:
        """``local`` is the window's mean gradient here; the weights to continue from come back.

        They come back in the client's own buffer, not copied into ``pulled``: the
        worker loads them into its replica before its next push overwrites them, and
        the copy would cost every worker 0.4 ms a round for nothing.
        """
        return client.push_pull(local)

    def apply(
        self,
        center: np.ndarray,
        delta: np.ndarray,
        *,
        staleness: int = 0,
        pulled: np.ndarray | None = None,
    ) -> None:
        if self._optimizer is None or self._optimizer.size != center.size:
            self._optimizer = optimizers.get(
                self.worker_optimizer, center.size
            )  # a server used without bind()
        if self._averaged is None:
            self._optimizer.apply(center, delta)
            return
        averaged = self._averaged
        kept = center[averaged] + delta[averaged]
        self._optimizer.apply(center, np.where(averaged, np.float32(0), delta))
        center[averaged] = kept

    def server_state(self) -> dict[str, np.ndarray]:
        return self._optimizer.state() if self._optimizer is not None else {}

    def scale_learning_rate(self, scale: float) -> bool:
        if self._optimizer is None:
            return False
        self._optimizer.lr_scale = scale
        return True

    def load_server_state(self, state: dict[str, np.ndarray]) -> None:
        if state:
            assert self._optimizer is not None, "bind() the model before restoring the optimizer"
            self._optimizer.load_state(state)


class GradientWorker(WorkerHalf):
    """Synchronous SGD's worker half: mean gradients out, the center back.

    Without ``overlap``, each push waits for its round and the replica continues from
    the center it brought back, so every gradient is computed on the center it is
    applied to (staleness 0, as in one process). With ``overlap``, a window's mean
    gradient is pushed from a background thread and the next window computes meanwhile,
    so the exchange (the round's wait for the other workers, the server's optimizer
    step, 4 MB through shared memory or the socket) costs nothing but the load of the
    new center before the window after; the price is one round of staleness (recorded
    per push). That window's gradient will be applied to the center one step after
    the one the replica has, so it is computed on a prediction of it: the center plus
    the last step's own change (Adam's steps change slowly, so the last one is a good
    guess of the next). ``bench/ablation.py``'s ``sync_predict`` arm measures it.
    """

    def __init__(
        self, algorithm: Algorithm, client: ExchangeClient, replica: Any, pulled: np.ndarray
    ) -> None:
        super().__init__(algorithm, client, replica, pulled)
        self.weights = replica.weights
        self.summed: np.ndarray | None = None
        self.count = 0
        # Weights that gradients do not train (batch-norm statistics) send their change instead.
        self.averaged = replica.spec.untrained()
        self.base = pulled[self.averaged] if self.averaged is not None else None
        overlap = bool(getattr(algorithm, "overlap", False))
        self.pool = (
            ThreadPoolExecutor(1, thread_name_prefix="streamtrain-push") if overlap else None
        )
        self.pending: tuple[Future[np.ndarray], int] | None = None
        # The prediction extrapolates the last step, so it needs centers that come back exact:
        # over a narrowed wire (bfloat16, float16) two centers differ by their rounding as much
        # as by the step, and the overlapped gradient is computed on the center as it came.
        self.predict = overlap and getattr(client, "wire_dtype", "float32") == "float32"
        self.weights_clock = client.clock  # the center the replica's weights came from
        # With overlap: the center loaded last (the prediction's base; None before the first).
        self.last_center: np.ndarray | None = None

    def compute(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        grad, loss, acc = self.replica.gradients(x, y)
        self.input_grad = self.replica.gradients.input_grad
        self.pred = self.replica.gradients.pred
        # Each window sums into a new buffer: the last one may still be in flight.
        self.summed = (
            grad
            if self.summed is None
            else np.add(self.summed, grad, out=None if self.count == 1 else self.summed)
        )
        self.count += 1
        return loss, acc

    def exchange(self) -> None:
        assert self.summed is not None
        mean = (
            self.summed
            if self.count == 1
            else np.multiply(self.summed, np.float32(1.0 / self.count), out=self.summed)
        )
        self.summed, self.count = None, 0
        if self.averaged is not None:
            mean = np.array(mean)  # writable
            mean[self.averaged] = self.weights.get()[self.averaged] - self.base
        computed_at = self.weights_clock
        if self.pool is None:
            self._load(self.algorithm.exchange(self.client, mean, self.pulled), computed_at)
            return
        self._finish()
        future = self.pool.submit(self.algorithm.exchange, self.client, mean, self.pulled)
        self.pending = (future, computed_at)

    def _finish(self) -> None:
        """Wait for the push in flight and continue from the center it brought back."""
        if self.pending is None:
            return
        future, computed_at = self.pending
        self.pending = None
        self._load(future.result(), computed_at)

    def _load(self, center: np.ndarray, computed_at: int) -> None:
        """Continue from ``center``, which a push of a gradient computed at ``computed_at`` brought
        back."""
        self.weights.set(self._predicted(center) if self.predict else center)
        if self.averaged is not None:
            self.base = center[self.averaged]
        # The round applied it at clock - 1; its gradient was computed on the center of computed_at.
        self.staleness.append(max(0, self.client.clock - 1 - computed_at))
        self.weights_clock = self.client.clock

    def _predicted(self, center: np.ndarray) -> np.ndarray:
        """The center one step after ``center``: ``center`` plus the change since the center
        loaded before it (averaged weights, which no step trains, as they are).

        >>> from types import SimpleNamespace
        >>> half = SimpleNamespace(last_center=None, averaged=np.array([False, True]))
        >>> GradientWorker._predicted(half, np.array([1.0, 5.0], np.float32)).tolist()
        [1.0, 5.0]
        >>> GradientWorker._predicted(half, np.array([1.5, 6.0], np.float32)).tolist()
        [2.0, 6.0]
        """
        last = self.last_center
        if last is None or last.shape != center.shape:
            self.last_center = np.array(center)  # a copy: center is the client's buffer
            return center
        # One new array a round: the change, then the center added in place; ``last`` keeps
        # its buffer and takes this center for the next round.
        predicted = np.subtract(center, last)
        predicted += center
        np.copyto(last, center)
        if self.averaged is not None:
            predicted[self.averaged] = center[self.averaged]
        return predicted

    def close(self) -> None:
        try:
            self._finish()
        finally:
            if self.pool is not None:
                self.pool.shutdown(wait=True)
