"""AEASGD, asynchronous elastic averaging SGD (Zhang, Choromanska, LeCun,
"Deep learning with Elastic Averaging SGD", NIPS 2015).

Worker: every ``communication_window`` mini-batches, pull the center ``c``,
compute the elastic difference ``e = alpha * (w_local - c)`` with
``alpha = learning_rate * rho``, push ``e`` and continue from ``w_local - e``.
Server: ``center += e``. Replicas keep their own weights, pulled towards the
center rather than replaced by it, which lets them explore.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pipeline.errors import ConfigError
from pipeline.train.algorithms.base import Algorithm, ExchangeClient


@dataclasses.dataclass
class AEASGD(Algorithm):
    """Elastic averaging. ``rho`` is the elastic force, ``learning_rate`` its step.

    Example:
        >>> AEASGD(rho=5.0, learning_rate=0.01).alpha
        0.05
    """

    name = "aeasgd"
    rho: float = 5.0
    learning_rate: float = 0.01
    communication_window: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.alpha <= 1:
            raise ConfigError(
                f"Expected 0 < learning_rate * rho <= 1 for elastic averaging. "
                f"Received: learning_rate={self.learning_rate}, rho={self.rho}"
            )

    @property
    def alpha(self) -> float:
        return round(self.learning_rate * self.rho, 12)

    def exchange(self, client: ExchangeClient, local: np.ndarray, pulled: np.ndarray) -> np.ndarray:
        center = client.pull()
        elastic = (local - center) * np.float32(self.alpha)
        client.push(elastic)
        return local - elastic
