"""ADAG as in Hermans' thesis (2017): AGN deltas, damped by how far the center moved.

Worker: as AGN, push ``delta = (w_local - w_pulled) / communication_window``.
Server: with ``c_pulled`` the center this worker last pulled,
``center += delta / (1 + (center - c_pulled)^2 / learning_rate)``, elementwise:
a coordinate that other workers moved a lot since this worker pulled takes less
of its (stale) update.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pipeline.errors import ConfigError
from pipeline.train.algorithms.agn import AGN


@dataclasses.dataclass
class ADAG(AGN):
    """Distance-normalized asynchronous updates.

    Args:
        learning_rate: the scale of the distance damping (dist-keras used 1.0).

    Example:
        >>> import numpy as np
        >>> center = np.array([1.0, 0.0], np.float32)
        >>> ADAG(learning_rate=1.0).apply(
        ...     center, np.array([1, 1], np.float32), pulled=np.zeros(2, np.float32)
        ... )
        >>> center.tolist()   # the first coordinate moved by 1 since the pull: half the update
        [1.5, 1.0]
    """

    name = "adag"
    keep_pulled = True
    learning_rate: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.learning_rate > 0:
            raise ConfigError(
                f"Expected learning_rate > 0 for ADAG. Received: learning_rate={self.learning_rate}"
            )

    def apply(
        self,
        center: np.ndarray,
        delta: np.ndarray,
        *,
        staleness: int = 0,
        pulled: np.ndarray | None = None,
    ) -> None:
        if pulled is None:  # never pulled: nothing moved under it
            np.add(center, delta, out=center)
            return
        moved = center - pulled
        np.square(moved, out=moved)
        moved *= np.float32(1.0 / self.learning_rate)
        moved += np.float32(1.0)
        np.divide(delta, moved, out=moved)
        np.add(center, moved, out=center)
