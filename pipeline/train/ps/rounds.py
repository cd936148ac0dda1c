"""Synchronous rounds: one push from every worker in the round, their mean applied at once.

Model averaging and synchronous SGD push through rounds. A round closes when as many
pushes as expected workers have come, or when a member leaves and the rest have all
pushed, or after a timeout (a worker that hangs): the others never wait forever.

A straggler (a worker on a slow or busy host) would hold every round to its pace. Each
member's pace is the seconds from its last answer to its next push (its compute, not its
waits: counted push to push, a fast worker held in step takes the straggler's pace). A
push waits for the members still missing from its round at most ``straggler_wait`` times
its own pace, and not at all for those whose pace says they come later than that: the
round then closes with the pushes it has (a short round, counted). A straggler, a member
at least ``STRAGGLER_RATIO`` times slower than the fastest other, whose push opens a round
is answered at once: its gradient waits in the round for the next push and is applied
with it, one round staler, so neither the fast workers nor the slow one wait for the
other. No gradient is dropped: each lands in exactly one round, and its task's ledger
(:mod:`pipeline.train.ps.tasks`) counted it as it came, so a retry or a speculative copy
of that task skips it, as with any applied exchange. A gradient still waiting when the
micro-batch ends is applied by :meth:`Rounds.flush`, before the checkpoint.
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
#: A member this many times slower than the fastest other is a straggler: its push is
#: answered at once instead of waiting for the others' next ones.
STRAGGLER_RATIO = 1.5


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

    def __init__(
        self,
        size: int,
        *,
        workers: int,
        lock: threading.Lock,
        apply_mean: Callable[[np.ndarray, int], None],
        timeout_s: float = 30.0,
        straggler_wait: float = 0.0,
        on_short: Callable[[], None] | None = None,
    ) -> None:
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
        self._answered: dict[int, float] = {}  # member: when its last push was answered
        self._pace: dict[int, float] = {}  # member: seconds from an answer to its next push
        self._pushed: set[int] = set()  # members with a push in the open round
        self._cutoff: float | None = None  # when the open round stops waiting for stragglers
        self._arrived: list[float] = []  # when each push that waits on the open round came
        #: Seconds pushes spent waiting for the rest of their round, and waiting for its step
        #: (summed over pushes: a round of two that steps for 2 ms adds 4 ms).
        self.wait_s = 0.0
        self.step_s = 0.0

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
            self._answered.pop(member, None)
            self._pace.pop(member, None)
        if member not in self._members:
            return
        self._members.discard(member)
        self._left += int(done)
        if self._count and self._count >= self._size():
            self._close()

    def push(self, delta: np.ndarray, member: int = 0) -> None:
        """Add ``delta`` (from ``member``) to the open round and wait until the round is
        applied (a straggler's push: until it is in the round)."""
        now = time.monotonic()
        if member in self._answered:  # its compute since its last answer, smoothed
            took = now - self._answered[member]
            self._pace[member] = (
                took if member not in self._pace else 0.5 * (self._pace[member] + took)
            )
        np.add(self._sum, delta, out=self._sum)
        self._count += 1
        self._pushed.add(member)
        self._arrived.append(now)
        closes = self._closes
        if self._count >= self._size():
            self._close()
        elif self.straggler_wait > 0 and member in self._pace:  # a first push has no pace: it waits
            if self._count == 1 and self._straggler(member):
                self._arrived.pop()  # answered at once: it waits for nothing
                self._answered[member] = time.monotonic()
                return  # its gradient waits in the round for the next push
            window = max(MIN_WAIT_S, self.straggler_wait * self._pace[member])
            due = self._due()
            if due is not None and due > now + window:  # nobody missing comes within the window
                self._short()
            elif self._count == 1:
                self._cutoff = now + window
        deadline = now + self.timeout_s
        while self._closes == closes:
            cutoff = self._cutoff if self._cutoff is not None else deadline
            left = min(cutoff, deadline) - time.monotonic()
            if left > 0:
                self._closed.wait(left)
                continue
            if time.monotonic() >= deadline:  # a worker that hangs: apply what came
                log.warning(
                    "a synchronous round waited %.0f s for %d of %d workers; applying it without "
                    "them",
                    self.timeout_s,
                    self._size() - self._count,
                    self._size(),
                )
                self._close()
            else:  # a straggler: its push joins a later round
                self._short()
        self._answered[member] = time.monotonic()

    def flush(self) -> None:
        """Apply the open round's pushes, if any (between micro-batches: a straggler's
        gradient still waiting for a next push that its batch no longer has)."""
        if self._count:
            self._close()

    def _due(self) -> float | None:
        """When the first member missing from the open round is due to push, by its pace
        (None where one has no pace yet: it is waited for)."""
        missing = [m for m in self._members if m not in self._pushed]
        if not missing or any(m not in self._pace for m in missing):
            return None
        return min(self._answered[m] + self._pace[m] for m in missing)

    def _straggler(self, member: int) -> bool:
        others = [pace for m, pace in self._pace.items() if m != member and m in self._members]
        return bool(others) and self._pace[member] >= STRAGGLER_RATIO * min(others)

    def _short(self) -> None:
        self.short += 1
        if self._on_short is not None:
            self._on_short()
        self._close()

    def _size(self) -> int:
        # The expected workers less those that left, or more if more joined.
        return max(1, len(self._members), self.workers - self._left)

    def _close(self) -> None:
        closing = time.monotonic()
        self._sum *= np.float32(1.0 / self._count)
        self._apply_mean(self._sum, self._count)
        self.wait_s += sum(closing - t for t in self._arrived)
        self.step_s += (time.monotonic() - closing) * len(self._arrived)
        self._arrived.clear()
        self._sum.fill(0)
        self._count = 0
        self._pushed.clear()
        self._cutoff = None
        self._closes += 1
        self._closed.notify_all()
