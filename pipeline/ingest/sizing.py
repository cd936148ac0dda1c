"""Micro-batch sizing for a freshness target (``--freshness-target SECONDS``).

A record waits for the batch that plans it (up to one batch cycle: trigger, tasks, checkpoint,
commit), then for that batch to train it (one more cycle). So the model stays about
``target`` seconds fresh while a cycle lasts about ``share x target`` (half of it by default).
Each trigger plans as many records as the measured training rate gets through in that time,
within the user's bounds:

- the rate is measured from the batches themselves, records over the seconds from their
  trigger to the next one, so that the per-batch costs count; a batch that took all there was
  only says the rate is at least that (it waited for records, not for training);
- while records are left behind at a trigger (a burst, or batches too small for their fixed
  costs), each trigger plans twice the last, up to the upper bound: bigger batches spread the
  fixed costs over more records, the fastest way through a backlog, and the lag stops growing
  wherever the trainer keeps up on average;
- once a trigger finds no more than its size waiting, it takes all of it (what a batch leaves
  behind would wait a whole cycle more, so a cap below what waits never makes the model
  fresher), and the size for later triggers halves back toward the rate's figure (never below
  it), so that it shrinks after a burst without swinging.

Sizing changes how many offsets a new batch plans, never which records train: Spark logs
each batch's offsets before running it and replays a failed one from its log, without asking
the source again.

Example:
    >>> s = TriggerSizer(Sizing(target_s=2.0, min_rows=100, max_rows=20_000))
    >>> s.plan(now=0.0, pending=50_000)      # nothing measured yet: the upper bound
    20000
    >>> s.plan(now=5.0, pending=30_000)      # 20,000 in 5 s: 4,000/s, behind: no shrink
    20000
    >>> s.plan(now=10.0, pending=500)        # caught up: takes all; the size halves after it
    20000
    >>> s.size                               # not below 4,000/s x 1 s
    10000
    >>> s.plan(now=10.5, pending=300)        # 500 in 0.5 s took all there was: no new figure
    10000
    >>> s.plan(now=10.8, pending=300), s.size
    (5000, 4000)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from pipeline.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Sizing:
    """A freshness target and the bounds of a batch's size.

    Attributes:
        target_s: how fresh the model should stay, in seconds.
        min_rows, max_rows: records a batch plans at least (where that many wait) and at most.
        share: the share of the target a batch cycle may take.
    """

    target_s: float
    min_rows: int
    max_rows: int
    share: float = 0.5

    def __post_init__(self) -> None:
        if not self.target_s > 0:
            raise ConfigError(
                f"Expected --freshness-target > 0 seconds. Received: {self.target_s}. Pass how "
                "fresh the model should stay, or leave it out for fixed-size batches."
            )
        if not 1 <= self.min_rows <= self.max_rows:
            raise ConfigError(
                "Expected 1 <= --min-offsets-per-trigger <= --max-offsets-per-trigger. Received: "
                f"{self.min_rows} and {self.max_rows}. Pass a lower bound from 1 up to the upper "
                "bound."
            )
        if not 0 < self.share <= 1:
            raise ConfigError(f"Expected a share of the target in (0, 1]. Received: {self.share}")

    def options(self) -> dict[str, str]:
        """The Python source's options for it.

        >>> Sizing(2.0, 500, 20_000).options()  # doctest: +NORMALIZE_WHITESPACE
        {'freshnessTarget': '2.0', 'freshnessMinOffsets': '500', 'freshnessShare': '0.5',
        'maxOffsetsPerTrigger': '20000'}
        """
        return {
            "freshnessTarget": str(self.target_s),
            "freshnessMinOffsets": str(self.min_rows),
            "freshnessShare": str(self.share),
            "maxOffsetsPerTrigger": str(self.max_rows),
        }

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> Sizing | None:
        """Read :meth:`options` back (None where no target is set); ``options`` may be
        Spark's, whose keys are case-insensitive.

        >>> Sizing.from_options(Sizing(2.0, 500, 20_000).options()) == Sizing(2.0, 500, 20_000)
        True
        """
        target = options.get("freshnessTarget")
        if not target:
            return None
        return cls(
            float(target),
            int(options.get("freshnessMinOffsets") or 1),
            int(options.get("maxOffsetsPerTrigger") or 20_000),
            float(options.get("freshnessShare") or 0.5),
        )


class TriggerSizer:
    """Plans each trigger's records for a :class:`Sizing`; call :meth:`plan` once a trigger.

    Args:
        sizing: the target and bounds.
        smoothing: the weight of a new measurement of the rate (an exponential average).
    """

    def __init__(self, sizing: Sizing, *, smoothing: float = 0.5) -> None:
        self.sizing, self.smoothing = sizing, smoothing
        self.rate: float | None = None  # records/s over a cycle, per-batch costs included
        self.size = sizing.max_rows
        self._last: tuple[float, int, bool] | None = (
            None  # the last batch: when, records, whether full
        )

    def plan(self, *, now: float, pending: int) -> int:
        """The records this trigger plans at most, at monotonic time ``now`` with ``pending``
        records waiting; what it returns, up to ``pending``, is taken as planned."""
        s = self.sizing
        if self._last is not None:
            at, n, full = self._last
            measured = n / max(now - at, 1e-3)
            if self.rate is None or full:
                self.rate = (
                    measured
                    if self.rate is None
                    else (self.smoothing * measured + (1 - self.smoothing) * self.rate)
                )
            else:  # it took all there was: the trainer is at least this fast
                self.rate = max(self.rate, measured)
        limit = self.size
        if self.rate is not None:
            if pending > self.size:  # left behind: grow now, toward the upper bound
                self.size = limit = min(self.size * 2, s.max_rows)
            else:  # caught up: this trigger takes all there is, later ones plan less
                shrunk = round(max(self.rate * s.share * s.target_s, self.size / 2))
                self.size = max(s.min_rows, min(s.max_rows, shrunk))
        planned = min(limit, pending)
        # An empty trigger runs no batch: the idle time until the next one is no cycle.
        self._last = (now, planned, pending >= limit) if planned else None
        return limit
