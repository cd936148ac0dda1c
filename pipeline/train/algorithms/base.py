"""The base of every training algorithm: what a worker sends, and how the server applies it.

An algorithm has two halves that meet only through flat float32 buffers:

* the worker half, :meth:`Algorithm.worker`, a
  :class:`~pipeline.train.algorithms.worker_half.WorkerHalf` that learns from each mini-batch and,
  every ``communication_window`` of them, calls :meth:`Algorithm.exchange`, which talks to the
  parameter server through a client and returns the weights the replica continues from;
* the server half, :meth:`Algorithm.apply`, a function that changes the center
  weights in place from one pushed buffer (and the push's staleness). It is pure
  except in algorithms that keep an optimizer on the server (synchronous SGD),
  whose state :meth:`Algorithm.server_state` hands to the checkpoint.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from pipeline.errors import ConfigError
from pipeline.train.algorithms.worker_half import DeltaWorker, WorkerHalf
from pipeline.train.ps.rules import add_delta

if TYPE_CHECKING:
    from pipeline.train.model import ModelSpec


class ExchangeClient(Protocol):
    """What an algorithm needs of the parameter-server client
    (:class:`pipeline.train.ps.Client`)."""

    clock: int
    last_staleness: int

    def pull(self) -> np.ndarray: ...

    def push(self, delta: np.ndarray) -> int: ...

    def push_pull(self, delta: np.ndarray) -> np.ndarray: ...


@dataclasses.dataclass
class Algorithm(abc.ABC):
    """Settings shared by all algorithms, named as in dist-keras.

    Args:
        worker_optimizer: the replicas' Keras optimizer (a name or a config dict).
        loss: the Keras loss.
        num_workers: parallel replicas.
        batch_size: mini-batch size on each replica.
        communication_window: mini-batches between exchanges with the server.
        seed: seeds Keras and the data order, for reproducible runs.
    """

    name: ClassVar[str]
    #: The server keeps each worker's last pulled center (for :meth:`apply`'s ``pulled``).
    keep_pulled: ClassVar[bool] = False
    #: Pushes form synchronous rounds whose mean is applied once (model averaging).
    synchronous: ClassVar[bool] = False
    #: The setting that sets the communication window (``streamtrain run --window``).
    window_setting: ClassVar[str] = "communication_window"
    #: Workers push gradients, not weight deltas, and never step an optimizer themselves.
    pushes_gradients: ClassVar[bool] = False

    worker_optimizer: str | dict[str, Any] = "adam"
    loss: str = "sparse_categorical_crossentropy"
    num_workers: int = 2
    batch_size: int = 128
    communication_window: int = 5
    seed: int | None = None

    def __post_init__(self) -> None:
        for field in ("num_workers", "batch_size", "communication_window"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"Received an invalid value for `{field}`, expected a positive integer. "
                    f"Received: {field}={value!r}"
                )

    @property
    def worker_batch_size(self) -> int:
        """The records of one mini-batch on one worker (``batch_size``, except in synchronous
        SGD)."""
        return self.batch_size

    # --- worker half ---

    def worker(self, client: ExchangeClient, replica: Any, pulled: np.ndarray) -> WorkerHalf:
        """Hook: this algorithm's side of one partition on a worker (see
        :mod:`~pipeline.train.algorithms.worker_half`). Default: train with the replica's
        optimizer, and :meth:`exchange` the change every window."""
        return DeltaWorker(self, client, replica, pulled)

    def exchange(self, client: ExchangeClient, local: np.ndarray, pulled: np.ndarray) -> np.ndarray:
        """Send this window's update; return the weights to continue from.

        The default, for the delta family: push ``local - pulled`` (scaled by
        :meth:`scale_delta`) and continue from the new center. ``pulled`` is the
        center this replica started the window from; it is updated in place.
        """
        delta = self.scale_delta(local - pulled)
        center = client.push_pull(delta)
        np.copyto(pulled, center)
        return pulled

    def scale_delta(self, delta: np.ndarray) -> np.ndarray:
        """Hook: how the worker scales its accumulated delta before pushing."""
        return delta

    # --- server half ---

    def apply(
        self,
        center: np.ndarray,
        delta: np.ndarray,
        *,
        staleness: int = 0,
        pulled: np.ndarray | None = None,
    ) -> None:
        """Change ``center`` in place from one pushed buffer. Default: center += delta."""
        add_delta(center, delta)

    def bind(self, spec: ModelSpec) -> None:
        """Hook: the model the server half will update, before its first push (size server state
        here)."""
        return None

    def server_state(self) -> dict[str, np.ndarray]:
        """Hook: the server half's state beyond the center (for a checkpoint). Default: none."""
        return {}

    def load_server_state(self, state: dict[str, np.ndarray]) -> None:
        """Hook: restore what :meth:`server_state` returned."""
        return None

    def scale_learning_rate(self, scale: float) -> bool:
        """Hook: multiply the server half's learning rate by ``scale`` from now on (1: as
        configured); return whether it has one. Default: none (workers step their own)."""
        return False

    # --- config ---

    def get_config(self) -> dict[str, Any]:
        """Every constructor argument, JSON-serializable."""
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Algorithm:
        return cls(**config)
