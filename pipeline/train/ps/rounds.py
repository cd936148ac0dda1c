"""Synchronous rounds: one push from every worker in the round, their mean applied at once.

Model averaging and synchronous SGD push through rounds. A round closes when as many
pushes as expected workers have come, or when a member leaves and the rest have all
pushed, or after a timeout (a worker that hangs): the others never wait forever.

A straggler (a worker on a slow or busy host) would hold every round to its pace. A round
that has pushes waits for the rest at most ``straggler_wait`` times the pace of its first
pusher (the seconds between that worker's last two pushes), then closes with the pushes it
has: a short round, counted. The straggler's gradient is not dropped: it lands in the round
open when it comes, one round staler, and is applied there once. Its task's ledger
(:mod:`pipeline.train.ps.tasks`) counted it as it came, so a retry or a speculative copy of
that task skips it, as with any applied exchange.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np

log = logging.getLogger(__name__)

#: How long a round waits for its missing workers, as a share of its first pusher's pace.
STRAGGLER_WAIT = 0.5
#: The least a round waits for them (seconds): below it, jitter between equal workers, not a
#: straggler, would cut rounds short.
MIN_WAIT_S = 0.05


class Rounds:
    """The open round of a server's synchronous pushes.

    Args:
        size: weights per push.
        workers: the workers the rounds expect (:meth:`expect` changes it).
        lock: the server's lock; every method is called with it held.
        apply_mean: applies a round's mean to the center and advances the clock
            (called with the lock held); it gets the mean and the round's pushes.
        timeout_s: how long a round waits for its missing workers.
        straggler_wait: a round with pushes closes without its missing workers after this
            share of its first pusher's pace (0: it waits for them up to ``timeout_s``).
        on_short: called (with the lock held) for each round closed without a straggler.
    """

    def __init__(self, size: int, *, workers: int, lock: threading.Lock,
                 apply_mean: Callable[[np.ndarray, int], None], timeout_s: float = 30.0,
                 straggler_wait: float = 0.0, on_short: Callable[[], None] | None = None) -> None:
        self.workers = workers
        self.timeout_s = timeout_s
        self.straggler_wait = straggler_wait
        self._apply_mean, self._on_short = apply_mean, on_short
        self._closed = threading.Condition(lock)
        self._sum = np.zeros(size, np.float32)
        self._count = 0
        self._closes = 0  # rounds closed so far
        self.short = 0  # of them, closed without a straggler
        self._members: set[int] = set()  # connections in the rounds
        self._left = 0  # members that left since the rounds last had none
        self._last_push: dict[int, float] = {}  # member: when its last push came
        self._cutoff: float | None = None  # when the open round stops waiting for stragglers

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
        if done:  # a connection's id may be a later connection's: no pace carries over
            self._last_push.pop(member, None)
        if member not in self._members:
            return
        self._members.discard(member)
        self._left += int(done)
        if self._count and self._count >= self._size():
            self._close()

    def push(self, delta: np.ndarray, member: int = 0) -> None:
        """Add ``delta`` (from ``member``) to the open round and wait until the round is applied."""
        now = time.monotonic()
        pace = now - self._last_push[member] if member in self._last_push else None
        self._last_push[member] = now
        np.add(self._sum, delta, out=self._sum)
        self._count += 1
        closes = self._closes
        if self._count == 1 and pace is not None and self.straggler_wait > 0:
            # A worker's first push has no pace yet: the first round of a task waits for all.
            self._cutoff = now + max(MIN_WAIT_S, self.straggler_wait * pace)
        if self._count >= self._size():
            self._close()
            return
        deadline = now + self.timeout_s
        while self._closes == closes:
            cutoff = self._cutoff if self._cutoff is not None else deadline
            left = min(cutoff, deadline) - time.monotonic()
            if left > 0:
                self._closed.wait(left)
                continue
            if time.monotonic() >= deadline:  # a worker that hangs: apply what came
                log.warning("a synchronous round waited %.0f s for %d of %d workers; applying it without them",
                            self.timeout_s, self._size() - self._count, self._size())
            else:  # a straggler: its push joins a later round
                self.short += 1
                if self._on_short is not None:
                    self._on_short()
            self._close()

    def _size(self) -> int:
        # The expected workers less those that left, or more if more joined.
        return max(1, len(self._members), self.workers - self._left)

    def _close(self) -> None:
        self._sum *= np.float32(1.0 / self._count)
        self._apply_mean(self._sum, self._count)
        self._sum.fill(0)
        self._count = 0
        self._cutoff = None
        self._closes += 1
        self._closed.notify_all()
