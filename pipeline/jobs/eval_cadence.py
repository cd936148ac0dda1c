"""When a run scores its held-out split: every ``--eval-every`` batches, and with a freshness
target no more than a share of the streaming time."""

from __future__ import annotations

import time
from collections.abc import Callable

#: With a freshness target, the share of the streaming time held-out scoring may take: its
#: batches are small, and a score every few of them (0.75 s for MNIST's 10,000 records on 2
#: cores, measured at 504a444) took a sixth of the time at 2,000-record batches.
EVAL_SHARE = 0.1


class EvalCadence:
    """Whether each saved batch is scored: every ``every`` batches; with ``max_share``, a
    score that is due waits until the last one took at most that share of the time since
    it ended (counting batches from the last score, not in multiples of ``every``).

    Args:
        every: batches between scores (``--eval-every``).
        max_share: the share of the time scoring may take; None: no bound.
        clock: monotonic seconds.

    A due batch that is not scored (nothing trained yet) leaves the next one due: with a
    share, the first batch that can be scored is; without one, the next multiple of ``every``.

    Example: each batch takes 1 s and a score 0.45 s; scoring may take 10% of the time, so
    after the first score (batch 1) the next comes once 4.5 s have passed since it ended:

        >>> now = [0.0]
        >>> cadence = EvalCadence(2, max_share=0.1, clock=lambda: now[0])
        >>> scored = []
        >>> for batch in range(14):
        ...     now[0] += 1.0
        ...     if cadence.due(batch):
        ...         scored.append(batch)
        ...         cadence.scored(took_s=0.45)
        >>> scored
        [1, 6, 11]
        >>> [batch for batch in range(14) if EvalCadence(2).due(batch)]
        [1, 3, 5, 7, 9, 11, 13]
    """

    def __init__(
        self,
        every: int,
        *,
        max_share: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every, self.max_share, self._clock = every, max_share, clock
        self._batches = 0  # since the last score
        self._took_s = 0.0  # the last score's time
        self._ended: float | None = None  # when the last score ended

    def due(self, count: int) -> bool:
        """Whether batch ``count`` (0-based, in the run's history), just saved, is scored."""
        if self.max_share is None:
            return (count + 1) % self.every == 0
        self._batches += 1
        if self._batches < self.every:
            return False
        if self._ended is None:
            return True
        return self._took_s <= self.max_share * (self._clock() - self._ended)

    def scored(self, *, took_s: float) -> None:
        """A score took ``took_s``, ending now."""
        self._batches, self._took_s, self._ended = 0, took_s, self._clock()
