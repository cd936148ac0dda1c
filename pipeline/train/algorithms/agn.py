"""AGN, accumulated gradient normalization (Hermans, "On Scalable Deep Learning and
Parallelizing Gradient Descent", CERN / Maastricht 2017); dist-keras calls it ADAG.

Worker: push ``delta = (w_local - w_pulled) / communication_window``, the mean
update per mini-batch of the window, and continue from the new center.
Server: ``center += delta``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pipeline.train.algorithms.base import Algorithm


@dataclasses.dataclass
class AGN(Algorithm):
    """Delta normalized by the communication window.

    Example:
        >>> import numpy as np
        >>> AGN(communication_window=4).scale_delta(np.array([4.0], np.float32)).tolist()
        [1.0]
    """

    name = "agn"

    def scale_delta(self, delta: np.ndarray) -> np.ndarray:
        return delta / np.float32(self.communication_window)
