"""Each offset range's exchanges, applied once however often Spark runs its task.

Spark retries a failed task (``spark.task.maxFailures``, 4 on a cluster) and may run a
slow one twice at once (speculation). Each attempt trains the same range in the same
order, so its k-th exchange carries the same mini-batches as every other attempt's k-th.
A push names its task (:func:`pipeline.train.ps.protocol.task_key`) and its exchange's
index; the server applies exchange k of a task only as the one after k - 1, drops a
repeat of one it applied, and answers PROGRESS with how many it applied, so that a retry
starts after them (it skips their mini-batches instead of training them again).

An attempt that starts after k exchanges pushes k + 1, k + 2, ...; however attempts
interleave, each push is either the next one or a repeat. A gap means a client that
does not follow the protocol, and is refused.
"""

from __future__ import annotations

import collections

import numpy as np

from pipeline.train.ps.protocol import ProtocolError

#: Tasks remembered (least recently pushed forgotten first): many micro-batches' worth,
#: so that a straggling speculative attempt still finds its task.
MAX_TASKS = 1 << 16


class TaskProgress:
    """Per task: exchanges applied and the mini-batches they covered. The caller locks.

    Example:
        >>> t = TaskProgress()
        >>> (
        ...     t.admit(7, exchange=1, steps=5),
        ...     t.admit(7, exchange=1, steps=5),
        ...     t.admit(7, exchange=2, steps=3),
        ... )
        (True, False, True)
        >>> t.applied(7), t.repeats
        ((2, 8), 1)

    A task forgotten to bound the table is retired, 8 bytes a key, never admitted again
    (a straggler's repeat of it is dropped, not applied a second time):

        >>> t = TaskProgress(most=1)
        >>> t.admit(1, exchange=1, steps=1), t.admit(2, exchange=1, steps=1)
        (True, True)
        >>> t.admit(1, exchange=1, steps=1), t.repeats
        (False, 1)
    """

    def __init__(self, most: int | None = None) -> None:
        self._done: collections.OrderedDict[int, tuple[int, int]] = collections.OrderedDict()
        self._most = MAX_TASKS if most is None else most
        self.repeats = 0  # pushes dropped as repeats of an applied exchange
        self._retired = np.empty(0, np.uint64)  # sorted keys of forgotten tasks
        self._retiring: list[int] = []  # newly forgotten, merged into _retired in blocks

    def retired(self, task: int) -> bool:
        """Whether ``task`` was forgotten to bound the table (its exchanges were applied)."""
        if task in self._retiring:
            return True
        i = int(np.searchsorted(self._retired, np.uint64(task)))
        return i < self._retired.size and int(self._retired[i]) == task

    def applied(self, task: int) -> tuple[int, int]:
        """The exchanges of ``task`` applied so far and the mini-batches they covered."""
        return self._done.get(task, (0, 0))

    def admit(self, task: int, *, exchange: int, steps: int) -> bool:
        """Whether to apply this push (and count it as applied); False for a repeat.
        Raises :class:`ProtocolError` for an exchange that skips ahead."""
        done, covered = self._done.get(task, (0, 0))
        if exchange <= done or (not done and self.retired(task)):
            self.repeats += 1
            return False
        if exchange != done + 1:
            raise ProtocolError(
                f"exchange {exchange} of a task whose last applied exchange is {done}"
            )
        self._done[task] = (exchange, covered + steps)
        self._done.move_to_end(task)
        if len(self._done) > self._most:
            forgotten, _ = self._done.popitem(last=False)
            self._retiring.append(forgotten)
            if len(self._retiring) >= 1024:
                self._retired = np.union1d(self._retired, np.array(self._retiring, np.uint64))
                self._retiring = []
        return True
