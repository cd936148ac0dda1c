"""The parameter server without its sockets: the center weights, the clock and the update
rule, with what each worker last pulled, each task's applied exchanges and the synchronous
rounds, all changed under one lock.

:class:`~pipeline.train.ps.server.ParameterServer` gives it a transport and the driver's
interface; a request, authenticated and its lengths checked, comes here to be applied.
"""

from __future__ import annotations

import collections
import json
import threading
from typing import Any

import numpy as np

from pipeline.errors import ConfigError
from pipeline.train.ps import protocol as p
from pipeline.train.ps.rounds import Rounds
from pipeline.train.ps.rules import Rule
from pipeline.train.ps.stats import Counts
from pipeline.train.ps.tasks import TaskProgress

#: Worker ids whose last pull is remembered (for staleness).
MAX_WORKER_IDS = 4096


class ServerCore:
    """The center and its clock, changed by requests and read by the driver under one lock.

    Args:
        weights: initial center weights (copied, flattened to float32).
        lock: the server's lock (its :class:`~pipeline.train.ps.stats.Counts` share it).
        counts: what the server counts.
        rule, keep_pulled, sync_workers, sync_timeout_s, straggler_wait, state, clock: as
            for :class:`~pipeline.train.ps.server.ParameterServer`.
    """

    def __init__(
        self,
        weights: np.ndarray,
        *,
        lock: threading.Lock,
        counts: Counts,
        rule: Rule,
        keep_pulled: bool,
        sync_workers: int,
        sync_timeout_s: float,
        straggler_wait: float,
        state: Any,
        clock: int,
    ) -> None:
        self.center = np.array(weights, dtype=np.float32).ravel()
        self.size = self.center.size
        self.rule = rule
        self.keep_pulled = keep_pulled
        self.clock = clock
        self.state = state
        self._lock = lock
        self.counts = counts
        self._stats = counts.stats
        self._rounds = (
            Rounds(
                self.size,
                workers=sync_workers,
                lock=self._lock,
                apply_mean=self._apply_round,
                timeout_s=sync_timeout_s,
                straggler_wait=straggler_wait,
                on_short=lambda: self.counts.event("short_round"),
            )
            if sync_workers
            else None
        )
        self._last_pulled: collections.OrderedDict[int, int] = collections.OrderedDict()
        self._pulled: dict[int, np.ndarray] = {}
        self._tasks = TaskProgress()
        #: Pushes applied since start or restore: shards that each got every push agree on it,
        #: whatever their synchronous rounds' grouping made of their clocks.
        self.pushes_applied = 0

    # --- the driver's side ---

    def weights(self) -> np.ndarray:
        with self._lock:
            return self.center.copy()

    def snapshot(self) -> tuple[np.ndarray, int]:
        with self._lock:
            return self.center.copy(), self.clock

    def checkpoint(self) -> tuple[np.ndarray, int, dict[str, np.ndarray]]:
        with self._lock:
            if self._rounds is not None:  # taken between micro-batches: no push is to come
                self._rounds.flush()
            state = self.state.server_state() if self.state is not None else {}
            return self.center.copy(), self.clock, state

    def restore(
        self, weights: np.ndarray, clock: int, state: dict[str, np.ndarray] | None = None
    ) -> None:
        flat = np.asarray(weights, np.float32).ravel()
        if flat.size != self.size:
            raise ConfigError(f"Expected {self.size} weights to restore. Received: {flat.size}")
        with self._lock:
            np.copyto(self.center, flat)
            self.pushes_applied = 0
            self.clock = clock
            if state and self.state is not None:
                self.state.load_server_state(state)
            self._last_pulled.clear()
            self._pulled.clear()

    def expect_workers(self, n: int) -> None:
        if self._rounds is not None:
            with self._lock:
                self._rounds.expect(n)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "clock": self.clock,
                "size": self.size,
                "workers": len(self._last_pulled),
                "pulled_copies": len(self._pulled),
                "repeats_dropped": self._tasks.repeats,
                "short_rounds": self._rounds.short if self._rounds is not None else 0,
                # Of the workers' exchange seconds: waiting for the round's other pushes,
                # and for its optimizer step (synchronous rounds only).
                "round_wait_s": round(self._rounds.wait_s, 3) if self._rounds is not None else 0,
                "round_step_s": round(self._rounds.step_s, 3) if self._rounds is not None else 0,
                "pushes_applied": self.pushes_applied,
                **self._stats.as_dict(),
            }

    def applied(self, task: int) -> tuple[int, int]:
        with self._lock:
            return self._tasks.applied(task)

    # --- the workers' requests ---

    def answer(
        self, h: p.Header, inbox: np.ndarray, outbox: np.ndarray, *, member: int, shared: bool
    ) -> tuple[p.Header, memoryview | bytes]:
        """Apply one authenticated request; return the reply's header (its clock, a push's
        staleness in ``flags``, a task's progress) with ``length`` set, and its payload
        (the center in ``outbox``, or nothing where it is in shared memory).

        A push that names its task is applied only as that task's next exchange: a
        repeat (from a retried or speculative attempt) is dropped and answered as usual.
        """
        staleness = 0
        payload: memoryview | bytes = b""
        pushes = h.op in (p.PUSH, p.PUSH_PULL)
        with self._lock:
            applies = pushes and (
                not h.task or self._tasks.admit(h.task, exchange=h.exchange, steps=h.steps)
            )
            if self._rounds is not None and h.op not in (p.STATS, p.PEEK, p.PROGRESS):
                self._rounds.join(member)
                if pushes and not applies:  # nothing to add: no round may wait for it
                    self._rounds.leave(member, done=False)
            self.pushes_applied += int(applies)
            if applies and self._rounds is not None:
                self._rounds.push(inbox, member)
            elif applies:
                staleness = self._apply_push(h, inbox, member)
            exchange, steps = self._tasks.applied(h.task) if h.task else (0, 0)
            if h.op in (p.PULL, p.PUSH_PULL):
                self._pull_into(outbox, h.worker, member)
            elif h.op == p.PEEK:
                np.copyto(outbox, self.center)
            if h.op in (p.PULL, p.PUSH_PULL, p.PEEK):
                payload = b"" if shared else outbox.data.cast("B")  # shared: already in the file
            clock = self.clock
            # Counted before the reply leaves: a client that reads stats right after
            # its last answer must see that request counted.
            self._stats.count_op(p.OPS[h.op])
        if h.op == p.STATS:
            payload = json.dumps(self.stats()).encode()
        if pushes:
            steps = h.steps if applies else 0
        reply = p.Header(
            p.OK,
            h.worker,
            h.seq,
            clock,
            len(payload),
            flags=min(staleness, 0xFFFF),
            task=h.task,
            exchange=exchange,
            steps=steps,
        )
        return reply, payload

    def disconnected(self, member: int) -> None:
        with self._lock:
            self._pulled.pop(member, None)
            if self._rounds is not None:
                self._rounds.leave(member)

    # --- under the lock ---

    def _apply_push(self, h: p.Header, delta: np.ndarray, member: int) -> int:
        # Staleness from the server's own record of this worker's last pull; the
        # worker's claimed clock is used only before its first pull.
        staleness = max(0, self.clock - self._last_pulled.get(h.worker, h.clock))
        self.rule(self.center, delta, staleness=staleness, pulled=self._pulled.get(member))
        self.clock += 1
        self._stats.count_staleness(staleness)
        return staleness

    def _apply_round(self, mean: np.ndarray, pushes: int) -> None:
        self.rule(self.center, mean, staleness=0, pulled=None)
        self._stats.count_staleness(0, pushes)
        self.clock += 1

    def _pull_into(self, outbox: np.ndarray, worker: int, member: int) -> None:
        np.copyto(outbox, self.center)
        _remember(self._last_pulled, worker, self.clock)
        if self.keep_pulled:
            kept = self._pulled.setdefault(member, np.empty_like(self.center))
            np.copyto(kept, self.center)


def _remember(pulls: collections.OrderedDict[int, int], worker: int, clock: int) -> None:
    """Record a worker's pull; the least recent is forgotten past MAX_WORKER_IDS (ids are
    a client's word). Pulled centers are kept by connection instead, freed as it closes."""
    pulls[worker] = clock
    pulls.move_to_end(worker)
    if len(pulls) > MAX_WORKER_IDS:
        pulls.popitem(last=False)
