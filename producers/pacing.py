"""Pacing a sender to a rate: records per second on average since it started."""

from __future__ import annotations

import time
from collections.abc import Callable

from pipeline.errors import ConfigError


class RateLimiter:
    """Paces a sender to ``rate`` records/s on average since start (no burst debt beyond it).

    Example:
        >>> now = [0.0]
        >>> limiter = RateLimiter(
        ...     100, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)
        ... )
        >>> limiter.wait(50); now[0]
        0.5
        >>> limiter.wait(50); now[0]     # already on schedule: no extra sleep
        0.5
    """

    def __init__(
        self,
        rate: float | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        if rate is not None and rate <= 0:
            raise ConfigError(
                f"Expected --rate > 0 records/s (or none for full speed). Received: {rate}"
            )
        self.rate = rate
        self._clock, self._sleep = clock, sleep
        self._start = clock()

    def wait(self, sent: int) -> None:
        """Sleep until ``sent`` records are due."""
        if self.rate is None:
            return
        ahead = self._start + sent / self.rate - self._clock()
        if ahead > 0:
            self._sleep(ahead)

    def slice_size(self) -> int:
        """Records to send between waits: ~100 waits a second, at least 1."""
        return 4096 if self.rate is None else max(1, int(self.rate / 100))
