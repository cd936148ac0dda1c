"""Synchronous rounds: one push from every worker in the round, their mean applied at once.

Model averaging and synchronous SGD push through rounds. A round closes when as many
pushes as expected workers have come, or when a member leaves and the rest have all
pushed, or after a timeout (a worker that hangs): the others never wait forever.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import numpy as np

log = logging.getLogger(__name__)


class Rounds:
    """The open round of a server's synchronous pushes.

    Args:
        size: weights per push.
        workers: the workers the rounds expect (:meth:`expect` changes it).
        lock: the server's lock; every method is called with it held.
        apply_mean: applies a round's mean to the center and advances the clock
            (called with the lock held); it gets the mean and the round's pushes.
        timeout_s: how long a round waits for its missing workers.
    """

    def __init__(self, size: int, *, workers: int, lock: threading.Lock,
                 apply_mean: Callable[[np.ndarray, int], None], timeout_s: float = 30.0) -> None:
        self.workers = workers
        self.timeout_s = timeout_s
        self._apply_mean = apply_mean
        self._closed = threading.Condition(lock)
        self._sum = np.zeros(size, np.float32)
        self._count = 0
        self._closes = 0  # rounds closed so far
        self._members: set[int] = set()  # connections in the rounds
        self._left = 0  # members that left since the rounds last had none

    def expect(self, n: int) -> None:
        """How many workers the next rounds wait for (between jobs)."""
        self.workers = max(1, n)
        self._left = 0 if not self._members else self._left

    def join(self, member: int) -> None:
        """``member`` (a connection) takes part in the rounds from now on."""
        self._members.add(member)

    def leave(self, member: int, *, done: bool = True) -> None:
        """``member`` is gone: the round no longer waits for it. ``done``: a worker that
        finished or died (the rounds expect one worker fewer until :meth:`expect`); else
        one that only stands aside this round (its push was a repeat of an applied one).

        A worker that finished stays counted as gone even once no member is left: a task
        Spark runs again after the others finished replaces the dead worker, and trains
        in rounds of its own instead of waiting for workers that will not come."""
        if member not in self._members:
            return
        self._members.discard(member)
        self._left += int(done)
        if self._count and self._count >= self._size():
            self._close()

    def push(self, delta: np.ndarray) -> None:
        """Add ``delta`` to the open round and wait until the round is applied."""
        np.add(self._sum, delta, out=self._sum)
        self._count += 1
        closes = self._closes
        if self._count >= self._size():
            self._close()
            return
        self._closed.wait_for(lambda: self._closes != closes, timeout=self.timeout_s)
        if self._closes == closes:  # the wait timed out: apply what came
            log.warning("a synchronous round waited %.0f s for %d of %d workers; applying it without them",
                        self.timeout_s, self._size() - self._count, self._size())
            self._close()

    def _size(self) -> int:
        # The expected workers less those that left, or more if more joined.
        return max(1, len(self._members), self.workers - self._left)

    def _close(self) -> None:
        self._sum *= np.float32(1.0 / self._count)
        self._apply_mean(self._sum, self._count)
        self._sum.fill(0)
        self._count = 0
        self._closes += 1
        self._closed.notify_all()
