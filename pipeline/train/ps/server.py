"""The parameter server: center weights as one flat float32 buffer, a clock, an update rule.

It knows neither Spark nor TensorFlow. Workers on the server's machine move their
payloads through shared memory, others over TCP (:mod:`pipeline.train.ps.transport`);
either way every request is authenticated. An update rule (``rule``) changes the center
in place from a worker's delta; the server applies it, advances the clock and records
the push's staleness under one lock, so no update is lost and clock and staleness
always agree. Synchronous algorithms push through rounds (:mod:`pipeline.train.ps.rounds`).
"""

from __future__ import annotations

import atexit
import collections
import json
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

import numpy as np

from pipeline.errors import ConfigError
from pipeline.train.ps import protocol as p
from pipeline.train.ps.rounds import Rounds
from pipeline.train.ps.rules import Rule, add_delta
from pipeline.train.ps.stats import Counts
from pipeline.train.ps.tasks import TaskProgress
from pipeline.train.ps.transport import Transport

#: Worker ids whose last pull is remembered (for staleness).
MAX_WORKER_IDS = 4096


class ParameterServer:
    """Serves pull and push of one flat float32 weight buffer.

    Args:
        weights: initial center weights (copied, flattened to float32).
        secret: the per-run secret clients must prove they hold.
        host: address to bind; loopback unless workers run on other machines.
        port: 0 picks a free port.
        rule: the update rule applied to each push (default: center += delta).
        keep_pulled: keep each worker's last pulled center, for rules that use it.
        sync_workers: if > 0, pushes are synchronous rounds
            (:class:`~pipeline.train.ps.rounds.Rounds`): a round applies the mean of one push from
            each of ``sync_workers`` workers at once (:meth:`expect_workers` changes it), and each
            push_pull waits for its round; a worker that disconnects leaves the rounds. A round that
            waits ``sync_timeout_s`` closes with the pushes it has (a worker that hangs); one
            that waited ``straggler_wait`` times its first pusher's pace for the rest closes
            without them (a straggler; 0: never), its late pushes applied in later rounds.
        state: the update rule's own state (an object with ``server_state()`` and
            ``load_server_state(dict)``, such as an algorithm with a server-side
            optimizer), read by :meth:`checkpoint` under the same lock as the center.
        on_request, on_refusal: called with the operation's name and its seconds after each
            answered request, and with the reason of each refusal (for metrics); cheap, thread-safe.
        on_event: called with ``"short_round"`` for each synchronous round closed without a
            straggler and ``"broken"`` for each authenticated worker's connection cut mid-frame
            (for metrics; called with the server's lock held: cheap, and no call back into it).
        max_norm: refuse a push of a larger L2 norm (None: what float32 squares hold, ~1.8e19).
        shared_memory: offer workers on this machine a shared-memory file instead
            of the socket for payloads (:mod:`pipeline.train.ps.shm`); they fall back to
            TCP when they cannot map it.
        clock: the clock to start from (a resumed run's; see :meth:`restore`).

    Example:
        >>> import numpy as np
        >>> from pipeline.train.ps import Client
        >>> with ParameterServer(np.zeros(3, np.float32), secret=b"s") as server:
        ...     with Client(server.address, secret=b"s", worker=0, size=3) as c:
        ...         _ = c.pull()
        ...         c.push_pull(np.ones(3, np.float32)).tolist(), server.clock
        ([1.0, 1.0, 1.0], 1)
    """

    def __init__(
        self,
        weights: np.ndarray,
        *,
        secret: bytes,
        host: str = "127.0.0.1",
        port: int = 0,
        rule: Rule = add_delta,
        keep_pulled: bool = False,
        sync_workers: int = 0,
        sync_timeout_s: float = 30.0,
        straggler_wait: float = 0.0,
        on_request: Callable[[str, float], None] | None = None,
        on_refusal: Callable[[str], None] | None = None,
        on_event: Callable[[str], None] | None = None,
        max_norm: float | None = None,
        state: Any = None,
        shared_memory: bool = True,
        clock: int = 0,
    ) -> None:
        if not secret:
            raise ConfigError("The parameter server needs a non-empty secret.")
        self.center = np.array(weights, dtype=np.float32).ravel()
        self.size = self.center.size
        self.secret = secret
        self.rule = rule
        self.keep_pulled = keep_pulled
        self.clock = clock
        self.max_norm = max_norm
        self.state = state
        self._lock = threading.Lock()
        self.counts = Counts(
            self._lock, on_request=on_request, on_refusal=on_refusal, on_event=on_event
        )
        self._stats = self.counts.stats
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
        self._transport = Transport(self, host=host, port=port, shared_memory=shared_memory)

    @property
    def host(self) -> str:
        return self._transport.host

    @property
    def port(self) -> int:
        return self._transport.port

    @property
    def shared_memory(self) -> bool:
        """Whether workers on this machine are offered shared memory."""
        return self._transport.shared_memory

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    # --- life cycle ---

    def start(self) -> ParameterServer:
        self._transport.start()
        atexit.register(self.stop)
        return self

    def stop(self) -> None:
        """Close the listening socket and every connection; the port is free on return."""
        self._transport.stop()
        atexit.unregister(self.stop)

    def __enter__(self) -> ParameterServer:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --- state ---

    def weights(self) -> np.ndarray:
        """A consistent copy of the center weights."""
        with self._lock:
            return self.center.copy()

    def snapshot(self) -> tuple[np.ndarray, int]:
        """The center weights and the clock, taken together under the lock."""
        with self._lock:
            return self.center.copy(), self.clock

    def checkpoint(self) -> tuple[np.ndarray, int, dict[str, np.ndarray]]:
        """The center, the clock and the rule's state, taken together under the lock."""
        with self._lock:
            if self._rounds is not None:  # taken between micro-batches: no push is to come
                self._rounds.flush()
            state = self.state.server_state() if self.state is not None else {}
            return self.center.copy(), self.clock, state

    def restore(
        self, weights: np.ndarray, clock: int, state: dict[str, np.ndarray] | None = None
    ) -> None:
        """Replace the center, the clock and the rule's state (resuming from a checkpoint)."""
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
        """How many workers the next synchronous rounds wait for (call between jobs)."""
        if self._rounds is not None:
            with self._lock:
                self._rounds.expect(n)

    def stats(self) -> dict[str, Any]:
        """Clock, op counts and seconds, refusals by reason, staleness histogram."""
        with self._lock:
            return {
                "clock": self.clock,
                "size": self.size,
                "workers": len(self._last_pulled),
                "pulled_copies": len(self._pulled),
                "repeats_dropped": self._tasks.repeats,
                "short_rounds": self._rounds.short if self._rounds is not None else 0,
                **self._stats.as_dict(),
            }

    def applied(self, task: int) -> tuple[int, int]:
        """The exchanges of ``task`` (a :func:`~pipeline.train.ps.protocol.task_key`) this
        server applied, and the mini-batches they covered: its own count, whatever the
        workers report."""
        with self._lock:
            return self._tasks.applied(task)

    # --- requests (called by the transport) ---

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
        """A connection closed: it leaves the synchronous rounds."""
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
