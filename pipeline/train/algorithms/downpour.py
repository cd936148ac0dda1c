"""DOWNPOUR (Dean et al., "Large Scale Distributed Deep Networks", NIPS 2012).

Worker: every ``communication_window`` mini-batches, push the accumulated change
``delta = w_local - w_pulled`` and continue from the new center.
Server: ``center += delta``.
"""

from __future__ import annotations

import dataclasses

from pipeline.train.algorithms.base import Algorithm


@dataclasses.dataclass
class Downpour(Algorithm):
    """Asynchronous SGD with accumulated deltas. See the module docstring for the rule.

    Example:
        >>> import numpy as np
        >>> center = np.zeros(2, np.float32)
        >>> Downpour().apply(center, np.array([1, 2], np.float32)); center.tolist()
        [1.0, 2.0]
    """

    name = "downpour"
