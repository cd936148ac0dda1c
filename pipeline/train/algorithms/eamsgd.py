"""EAMSGD, elastic averaging with Nesterov momentum on the workers (Zhang, Choromanska,
LeCun, NIPS 2015).

The exchange is AEASGD's (``e = alpha * (w_local - c)``, push ``e``, continue
from ``w_local - e``; server ``center += e``); the replicas' local optimizer is
SGD with Nesterov momentum ``momentum`` and step ``learning_rate``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.errors import ConfigError
from pipeline.train.algorithms.aeasgd import AEASGD


@dataclasses.dataclass
class EAMSGD(AEASGD):
    """Elastic averaging with momentum workers.

    Example:
        >>> EAMSGD(momentum=0.9).local_optimizer()["config"]["nesterov"]
        True
    """

    name = "eamsgd"
    momentum: float = 0.9

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"Expected 0 <= momentum < 1. Received: momentum={self.momentum}")
        self.worker_optimizer = self.local_optimizer()

    def local_optimizer(self) -> dict[str, Any]:
        """The Keras config of the workers' Nesterov-momentum SGD."""
        return {
            "class_name": "SGD",
            "config": {
                "learning_rate": self.learning_rate,
                "momentum": self.momentum,
                "nesterov": True,
            },
        }
