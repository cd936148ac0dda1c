"""Whether a run keeps up with its stream, on the training driver's registry
(:mod:`pipeline.jobs.keeping_up`): the rate the stream brings, the rate the run trains, and
whether it is falling behind (what ``StreamtrainFallingBehind`` fires on)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge


class PaceMeters:
    """The run's pace against its stream, registered on ``registry``; NaN until known."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.needed = Gauge(
            "streamtrain_stream_arrival_records_per_second",
            "Records a second the stream brought over the last 30 s of batches: those read "
            "plus the lag's growth.",
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
        for gauge in (self.needed, self.has):
            gauge.set(float("nan"))
        self.behind.set(0)

    def set(self, *, needed: float, has: float, behind: bool) -> None:
        """The figures over the newest window (rates 0: not yet measured, left NaN)."""
        if has > 0 or needed > 0:
            self.needed.set(needed)
            self.has.set(has)
        self.behind.set(1 if behind else 0)
