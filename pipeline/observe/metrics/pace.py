"""Whether a run keeps up with its stream, on the training driver's registry
(:mod:`pipeline.jobs.keeping_up`): the rate the stream brings, the rate the run trains, and
whether it is falling behind (what ``StreamtrainFallingBehind`` fires on)."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge

#: Seconds without a batch after which the rates read NaN: Spark runs no batch while nothing
#: comes, and the last window's rates are no longer the stream's.
STALE_S = 60.0


class PaceMeters:
    """The run's pace against its stream, registered on ``registry``; the rates NaN until
    measured, and again :data:`STALE_S` after the last batch.

    Example:
        >>> from prometheus_client import CollectorRegistry
        >>> now = [0.0]
        >>> reg = CollectorRegistry()
        >>> m = PaceMeters(reg, clock=lambda: now[0])
        >>> m.set(needed=2_500, has=500, behind=True)
        >>> reg.get_sample_value("streamtrain_stream_arrival_records_per_second")
        2500.0
        >>> now[0] = 61.0
        >>> reg.get_sample_value("streamtrain_stream_arrival_records_per_second")
        nan
    """

    def __init__(
        self, registry: CollectorRegistry, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._clock = clock
        self._figures = (float("nan"), float("nan"), float("-inf"))  # needed, has, when
        self.needed = Gauge(
            "streamtrain_stream_arrival_records_per_second",
            "Records a second the stream brought over the last 30 s of batches: those read "
            "plus the lag's growth (NaN a minute after the last batch).",
            registry=registry,
        )
        self.has = Gauge(
            "streamtrain_train_pace_records_per_second",
            "Records a second the run read and trained over the same 30 s.",
            registry=registry,
        )
        self.behind = Gauge(
            "streamtrain_train_falling_behind",
            "1 while the stream brings more than the run trains and the lag grows (with "
            "--freshness-target, while the model is also staler than it); else 0.",
            registry=registry,
        )
        self.needed.set_function(lambda: self._fresh(0))
        self.has.set_function(lambda: self._fresh(1))
        self.behind.set(0)

    def _fresh(self, i: int) -> float:
        needed, has, when = self._figures
        return (needed, has)[i] if self._clock() - when <= STALE_S else float("nan")

    def set(self, *, needed: float, has: float, behind: bool) -> None:
        """The figures over the newest window (rates 0 and 0: not yet measured, left out)."""
        if has > 0 or needed > 0:
            self._figures = (needed, has, self._clock())
        self.behind.set(1 if behind else 0)
