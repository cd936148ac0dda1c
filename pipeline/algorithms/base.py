"""The base of every training algorithm: what a worker sends, and how the server applies it.

An algorithm has two halves that meet only through flat float32 buffers:

* the worker half, :meth:`Algorithm.exchange`, called every ``communication_window``
  mini-batches with the replica's weights; it talks to the parameter server through
  a client and returns the weights the replica continues from;
* the server half, :meth:`Algorithm.apply`, a pure function that changes the center
  weights in place from one pushed buffer (and the push's staleness).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar, Protocol

import numpy as np

from pipeline.errors import ConfigError


class ExchangeClient(Protocol):
    """What an algorithm needs of the parameter-server client (:class:`pipeline.ps.Client`)."""

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
                raise ConfigError(f"Received an invalid value for `{field}`, expected a positive integer. "
                                  f"Received: {field}={value!r}")

    # --- worker half ---

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

    def apply(self, center: np.ndarray, delta: np.ndarray, *, staleness: int = 0,
              pulled: np.ndarray | None = None) -> None:
        """Change ``center`` in place from one pushed buffer. Default: center += delta."""
        np.add(center, delta, out=center)

    # --- config ---

    def get_config(self) -> dict[str, Any]:
        """Every constructor argument, JSON-serializable."""
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Algorithm:
        return cls(**config)

    def describe(self) -> str:
        """The name and settings on one line."""
        settings = ", ".join(f"{k}={v}" for k, v in self.get_config().items())
        return f"{self.name}({settings})"
