"""The parameter server: center weights as one flat float32 buffer, a clock, an update rule.

It knows neither Spark nor TensorFlow. Workers on the server's machine move their
payloads through shared memory, others over TCP (:mod:`pipeline.train.ps.transport`);
either way every request is authenticated. An update rule (``rule``) changes the center
in place from a worker's delta; the server's core (:mod:`pipeline.train.ps.core`) applies
it, advances the clock and records the push's staleness under one lock, so no update is
lost and clock and staleness always agree. Synchronous algorithms push through rounds
(:mod:`pipeline.train.ps.rounds`).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

import numpy as np

from pipeline.errors import ConfigError
from pipeline.train.ps import protocol as p
from pipeline.train.ps.core import ServerCore
from pipeline.train.ps.rules import Rule, add_delta
from pipeline.train.ps.stats import Counts
from pipeline.train.ps.transport import Transport


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
        self.secret = secret
        self.max_norm = max_norm
        lock = threading.Lock()
        self.counts = Counts(lock, on_request=on_request, on_refusal=on_refusal, on_event=on_event)
        self._core = ServerCore(
            weights,
            lock=lock,
            counts=self.counts,
            rule=rule,
            keep_pulled=keep_pulled,
            sync_workers=sync_workers,
            sync_timeout_s=sync_timeout_s,
            straggler_wait=straggler_wait,
            state=state,
            clock=clock,
        )
        self.size = self._core.size
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

    @property
    def clock(self) -> int:
        """The center's version: rounds or pushes applied (from the restored clock)."""
        return self._core.clock

    @property
    def pushes_applied(self) -> int:
        """Pushes applied since start or restore: shards that each got every push agree on it,
        whatever their synchronous rounds' grouping made of their clocks."""
        return self._core.pushes_applied

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
        return self._core.weights()

    def snapshot(self) -> tuple[np.ndarray, int]:
        """The center weights and the clock, taken together under the lock."""
        return self._core.snapshot()

    def checkpoint(self) -> tuple[np.ndarray, int, dict[str, np.ndarray]]:
        """The center, the clock and the rule's state, taken together under the lock."""
        return self._core.checkpoint()

    def restore(
        self, weights: np.ndarray, clock: int, state: dict[str, np.ndarray] | None = None
    ) -> None:
        """Replace the center, the clock and the rule's state (resuming from a checkpoint)."""
        self._core.restore(weights, clock, state)

    def expect_workers(self, n: int) -> None:
        """How many workers the next synchronous rounds wait for (call between jobs)."""
        self._core.expect_workers(n)

    def stats(self) -> dict[str, Any]:
        """Clock, op counts and seconds, refusals by reason, staleness histogram."""
        return self._core.stats()

    def applied(self, task: int) -> tuple[int, int]:
        """The exchanges of ``task`` (a :func:`~pipeline.train.ps.protocol.task_key`) this
        server applied, and the mini-batches they covered: its own count, whatever the
        workers report."""
        return self._core.applied(task)

    # --- requests (called by the transport) ---

    def answer(
        self, h: p.Header, inbox: np.ndarray, outbox: np.ndarray, *, member: int, shared: bool
    ) -> tuple[p.Header, memoryview | bytes]:
        """Apply one authenticated request (:meth:`ServerCore.answer
        <pipeline.train.ps.core.ServerCore.answer>`); return the reply's header and payload."""
        return self._core.answer(h, inbox, outbox, member=member, shared=shared)

    def disconnected(self, member: int) -> None:
        """A connection closed: it leaves the synchronous rounds."""
        self._core.disconnected(member)
