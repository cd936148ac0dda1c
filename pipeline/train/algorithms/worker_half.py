"""An algorithm's worker half: what one replica does with each mini-batch and each window.

:meth:`Algorithm.worker <pipeline.train.algorithms.Algorithm.worker>` hands partition
training a :class:`WorkerHalf`; the training loop calls :meth:`~WorkerHalf.compute` for
every mini-batch, :meth:`~WorkerHalf.exchange` every ``communication_window`` of them
(and after the last), and :meth:`~WorkerHalf.close` once. The default,
:class:`DeltaWorker`, trains the replica with its own optimizer and pushes the change;
synchronous SGD's worker pushes gradients instead (:mod:`pipeline.train.algorithms.sync`).
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pipeline.train.algorithms.base import Algorithm, ExchangeClient


class WorkerHalf(abc.ABC):
    """One partition's exchanges, from the center pulled at its start.

    Args:
        algorithm: the algorithm (its :meth:`~Algorithm.exchange` talks to the server).
        client: the connection to the parameter server.
        replica: the resident replica (``model``, flat ``weights``, ``spec``, ``gradients``).
        pulled: the center the replica was loaded with; the half may update it in place.

    Attributes:
        staleness: per push, the server updates between the center a window started
            from and the one its push was applied to.
    """

    def __init__(
        self, algorithm: Algorithm, client: ExchangeClient, replica: Any, pulled: np.ndarray
    ) -> None:
        self.algorithm, self.client, self.replica, self.pulled = algorithm, client, replica, pulled
        self.staleness: list[int] = []
        #: The last mini-batch's gradient of the loss with respect to its input, where the
        #: replica is asked for it (``replica.input_grads``: an ID model's rows learn from it).
        self.input_grad: np.ndarray | None = None
        #: The last mini-batch's outputs before it trained, where the step hands them back
        #: (the prequential AUC of a binary classifier); None: it does not.
        self.pred: np.ndarray | None = None

    @abc.abstractmethod
    def compute(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """Learn from one mini-batch; return its loss and accuracy (NaN without one),
        measured in the forward pass, before the batch changed anything."""

    @abc.abstractmethod
    def exchange(self) -> None:
        """End a communication window: push this window's update, continue from the answer."""

    def close(self) -> None:
        """After the last exchange: finish what is still in flight (default: nothing is)."""
        return None


class DeltaWorker(WorkerHalf):
    """Train with the replica's optimizer; push the window's change (the dist-keras family)."""

    def compute(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        if getattr(self.replica, "input_grads", False):
            loss, acc, self.input_grad, self.pred = self.replica.input_step(x, y)
            return loss, acc
        out = self.replica.model.train_on_batch(x, y)
        return (
            (float(out[0]), float(out[1]))
            if isinstance(out, list | tuple)
            else (float(out), float("nan"))
        )

    def exchange(self) -> None:
        weights = self.replica.weights
        weights.set(self.algorithm.exchange(self.client, weights.get(), self.pulled))
        self.staleness.append(self.client.last_staleness)
