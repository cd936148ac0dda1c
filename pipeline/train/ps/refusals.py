"""Logging refused requests without flooding the log: the first one, then a summary at
most every ``interval_s`` of what was refused since (every refusal is counted in the
server's stats regardless)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


class RefusalLog:
    """Says the first refusal, then at most one summary line per ``interval_s``.

    Example:
        >>> lines, now = [], [0.0]
        >>> r = RefusalLog(lines.append, interval_s=10, clock=lambda: now[0])
        >>> for _ in range(500): r.refused("auth")
        >>> now[0] = 11; r.refused("frame")
        >>> lines  # doctest: +NORMALIZE_WHITESPACE
        ['parameter server refused a request (auth); more are summed up every 10 s', 'parameter
        server refused 500 more requests in the last 11 s (auth: 499, frame: 1)']
    """

    def __init__(
        self,
        say: Callable[[str], None],
        *,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.say, self.interval_s, self.clock = say, interval_s, clock
        self._lock = threading.Lock()
        self._since: float | None = None  # when the last line was said
        self._pending: dict[str, int] = {}

    def refused(self, reason: str) -> None:
        with self._lock:
            now = self.clock()
            if self._since is None:
                self._since = now
                line = (
                    f"parameter server refused a request ({reason}); more are summed up every "
                    f"{self.interval_s:g} s"
                )
            else:
                self._pending[reason] = self._pending.get(reason, 0) + 1
                if now - self._since < self.interval_s:
                    return
                line = self._summary(now)
        self.say(line)

    def flush(self) -> None:
        """Say what is still unsaid (when the server stops)."""
        with self._lock:
            line = self._summary(self.clock()) if self._pending else None
        if line:
            self.say(line)

    def _summary(self, now: float) -> str:
        assert self._since is not None
        n = sum(self._pending.values())
        detail = ", ".join(f"{k}: {v}" for k, v in sorted(self._pending.items()))
        line = (
            f"parameter server refused {n} more requests in the last {now - self._since:.0f} s "
            f"({detail})"
        )
        self._since, self._pending = now, {}
        return line


def logger_line(log: logging.Logger) -> Callable[[str], None]:
    """``say`` for :class:`RefusalLog` that writes WARNING lines to ``log``."""
    return lambda line: log.warning("%s", line)
