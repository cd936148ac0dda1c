"""Whether a run keeps up with its stream, said once when it stops doing so and once when it
does again (issue 57, item 3).

Each saved batch gives when it ended, the records it read and the lag it left in Kafka. Over
the batches of the last :data:`WINDOW_S` seconds, the stream brought the records read plus
the lag's growth, and the run took the records read: ``needed`` and ``has``, in records a
second. The run is *behind* where the stream brought more than :data:`SLACK` times what it
took and the lag grew by more than the window's largest batch (one batch of lag is the
trigger's own jitter, not a trend); with ``--freshness-target``, also only while the model is
staler than the target (a burst the sizer absorbs within it is what the target allows). It is
*keeping up again* once the lag stops growing over the window. The trend takes the lowest of
the window's last :data:`ENDS` lags over the highest of its first: one slow batch is no trend.

Example:
    >>> k = KeepingUp(window_s=10)
    >>> for t in range(0, 22, 2):  # 500 records/s trained; the lag grows by 2,000/s
    ...     said = k.observe(at=t, rows=1_000, lag=2_000 * t)
    ...     if said: print(t, said.split(";")[0])
    10 falling behind: the stream brings 2,500 records/s and the run trains 500/s
    >>> k.behind
    True
    >>> for t in range(22, 50, 2):  # 2,000 records/s trained; the lag shrinks by 500/s
    ...     said = k.observe(at=t, rows=4_000, lag=42_000 - 1_000 * (t - 20))
    ...     if said: print(t, said.split(";")[0])
    28 keeping up again: the run trains 1,700 records/s, the stream brings 1,500/s
"""

from __future__ import annotations

import collections

#: Seconds of batches the rates are taken over.
WINDOW_S = 30.0
#: How much more than the run takes the stream must bring for the run to be behind.
SLACK = 1.05
#: Batches the window must hold before anything is said.
MIN_BATCHES = 3
#: Batches kept at most (a clock that stands still would otherwise keep them all).
MAX_BATCHES = 10_000
#: Lags at each end of the window whose lowest and highest make the trend: one slow batch (a
#: retry, a pause) ends with a lag that is no trend.
ENDS = 3


class KeepingUp:
    """The stream's rate against the run's, batch by batch (on the driver).

    Args:
        target_s: the run's freshness target (None: none; behind is then the lag's trend alone).
        window_s: the seconds of batches the rates are taken over.
        judge: whether to say anything (False: the rates alone; a run whose own replay sends as
            fast as it can outruns its trainer by design).
    """

    def __init__(
        self, *, target_s: float | None = None, window_s: float = WINDOW_S, judge: bool = True
    ) -> None:
        self.target_s, self.window_s, self.judge = target_s, window_s, judge
        self._seen: collections.deque[tuple[float, int, int]] = collections.deque()
        #: Whether the run is behind now.
        self.behind = False
        #: Records a second the stream brought, and the run took, over the window (0: unknown).
        self.needed = self.has = 0.0

    def observe(
        self, *, at: float, rows: int, lag: int, freshness_s: float | None = None
    ) -> str | None:
        """A batch ended at ``at`` (seconds on any one clock) after reading ``rows`` records
        and leaving ``lag`` in Kafka; the line to say, where the run just fell behind or just
        caught up (None: nothing changed)."""
        seen = self._seen
        seen.append((at, rows, lag))
        while len(seen) > 2 and (at - seen[1][0] >= self.window_s or len(seen) > MAX_BATCHES):
            seen.popleft()  # the first kept batch starts the window (its rows are before it)
        start, _, first_lag = seen[0]
        span = at - start
        if len(seen) <= MIN_BATCHES or span <= 0:
            return None
        kept = list(seen)
        took = sum(r for _, r, _ in kept[1:])
        grew = lag - first_lag
        # The rates from the fourth batch on; a verdict once half a window of them is in.
        self.needed, self.has = (took + grew) / span, took / span
        if not self.judge or span < self.window_s / 2:
            return None
        if not self.behind:
            target = self.target_s
            stale = target is None or (freshness_s is not None and freshness_s > target)
            largest = max(r for _, r, _ in kept)
            # The trend from the window's ends: the lowest late lag over the highest early one.
            trend = min(g for _, _, g in kept[-ENDS:]) - max(g for _, _, g in kept[:ENDS])
            if self.needed > SLACK * self.has and trend > largest and stale:
                self.behind = True
                return (
                    f"falling behind: the stream brings {self.needed:,.0f} records/s and the run "
                    f"trains {self.has:,.0f}/s; the lag of {lag:,} records grows by "
                    f"{self.needed - self.has:,.0f}/s. Add workers (--workers) or cores, or "
                    "shorten the model, to keep up."
                )
        elif grew <= 0:
            self.behind = False
            said = (
                f"keeping up again: the run trains {self.has:,.0f} records/s, the stream brings "
                f"{self.needed:,.0f}/s; the lag "
            )
            if self.has > self.needed:
                drain = lag / (self.has - self.needed)
                return said + f"of {lag:,} records drains in about {drain:,.0f} s."
            return said + f"holds at {lag:,} records."
        return None
