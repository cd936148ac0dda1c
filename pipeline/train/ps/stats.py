"""What a parameter server counts: operations and their time, refusals, broken
connections, staleness; and who hears of each (the run's metrics)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass
class Stats:
    """Counters of one server; the server updates them under its lock."""

    refused: dict[str, int] = dataclasses.field(default_factory=dict)
    ops: dict[str, int] = dataclasses.field(default_factory=dict)
    op_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    staleness: dict[int, int] = dataclasses.field(default_factory=dict)
    shared: int = 0  # connections that attached shared memory
    broken: int = 0  # authenticated workers' connections cut mid-frame

    def refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def count_op(self, name: str) -> None:
        self.ops[name] = self.ops.get(name, 0) + 1

    def time_op(self, name: str, seconds: float) -> None:
        self.op_seconds[name] = self.op_seconds.get(name, 0.0) + seconds

    def count_staleness(self, staleness: int, n: int = 1) -> None:
        self.staleness[staleness] = self.staleness.get(staleness, 0) + n

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able copy (what :meth:`ParameterServer.stats` reports)."""
        return {
            "ops": dict(self.ops),
            "op_seconds": dict(self.op_seconds),
            "refused": dict(self.refused),
            "shared_memory": self.shared,
            "broken_connections": self.broken,
            "staleness": {str(k): v for k, v in sorted(self.staleness.items())},
        }


class Counts:
    """A server's :class:`Stats` behind its lock, and the callbacks told of each count.

    Args:
        lock: the server's lock.
        on_request, on_refusal, on_event: as for :class:`~pipeline.train.ps.server.ParameterServer`.
    """

    def __init__(
        self,
        lock: threading.Lock,
        *,
        on_request: Callable[[str, float], None] | None = None,
        on_refusal: Callable[[str], None] | None = None,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        self.stats = Stats()
        self._lock = lock
        self.on_request, self.on_refusal, self.on_event = on_request, on_refusal, on_event

    def finished(self, op: str, seconds: float) -> None:
        """A request was answered in ``seconds`` on the server."""
        with self._lock:
            self.stats.time_op(op, seconds)
        if self.on_request is not None:
            self.on_request(op, seconds)

    def refuse(self, reason: str) -> None:
        with self._lock:
            self.stats.refuse(reason)
        if self.on_refusal is not None:
            self.on_refusal(reason)

    def broken(self) -> None:
        """An authenticated worker's connection broke mid-frame (its process killed, its
        host gone): counted apart from refusals, which are outsiders' and broken clients'."""
        with self._lock:
            self.stats.broken += 1
            self.event("broken")

    def op(self, name: str) -> None:
        with self._lock:
            self.stats.count_op(name)

    def shared(self) -> None:
        with self._lock:
            self.stats.shared += 1

    def event(self, name: str) -> None:
        """A short round or a broken connection, told to ``on_event`` (the lock is held)."""
        if self.on_event is not None:
            self.on_event(name)
