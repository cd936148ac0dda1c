"""The single-worker baseline: one replica training alone, the reference point.

It is DOWNPOUR with ``num_workers=1``: with one worker the center always equals
the replica's weights after each exchange, which is plain mini-batch training.
"""

from __future__ import annotations

import dataclasses

from pipeline.errors import ConfigError
from pipeline.train.algorithms.base import Algorithm


@dataclasses.dataclass
class Single(Algorithm):
    """One worker, no parallelism: plain training through the same machinery.

    Example:
        >>> Single().num_workers
        1
    """

    name = "single"
    num_workers: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_workers != 1:
            raise ConfigError(
                "The single algorithm trains on exactly one worker. Received: "
                f"num_workers={self.num_workers}"
            )
