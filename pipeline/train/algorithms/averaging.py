"""Synchronous model averaging (as in Deeplearning4j's ParameterAveragingTrainingMaster).

Workers train from the same center; every ``averaging_frequency`` mini-batches
each pushes ``delta = w_local - w_center`` and waits; the server applies the mean
of the round's deltas, ``center += mean(delta)``, which sets the center to the
mean of the replicas, and every worker continues from it.
"""

from __future__ import annotations

import dataclasses

from pipeline.train.algorithms.base import Algorithm


@dataclasses.dataclass
class ModelAveraging(Algorithm):
    """Synchronous parameter averaging.

    Args:
        averaging_frequency: mini-batches between averaging rounds (replaces
            ``communication_window``, which follows it).

    Example:
        >>> ModelAveraging(averaging_frequency=8).communication_window
        8
    """

    name = "averaging"
    synchronous = True
    window_setting = "averaging_frequency"
    averaging_frequency: int = 5

    def __post_init__(self) -> None:
        self.communication_window = self.averaging_frequency
        super().__post_init__()
