"""DynSGD (Jiang et al., "Heterogeneity-aware Distributed Parameter Servers", SIGMOD 2017).

Worker: as DOWNPOUR, push ``delta = w_local - w_pulled``.
Server: ``center += delta / (staleness + 1)``, where staleness is the number of
updates applied since this worker pulled: stale updates count for less.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pipeline.train.algorithms.base import Algorithm


@dataclasses.dataclass
class DynSGD(Algorithm):
    """Staleness-aware asynchronous updates.

    Example:
        >>> import numpy as np
        >>> center = np.zeros(1, np.float32)
        >>> DynSGD().apply(center, np.array([3.0], np.float32), staleness=2); center.tolist()
        [1.0]
    """

    name = "dynsgd"

    def apply(
        self,
        center: np.ndarray,
        delta: np.ndarray,
        *,
        staleness: int = 0,
        pulled: np.ndarray | None = None,
    ) -> None:
        center += delta * np.float32(1.0 / (staleness + 1))
