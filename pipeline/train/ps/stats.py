"""What a parameter server counts: operations and their time, refusals, staleness."""

from __future__ import annotations

import dataclasses
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
        return {"ops": dict(self.ops), "op_seconds": dict(self.op_seconds), "refused": dict(self.refused),
                "shared_memory": self.shared, "broken_connections": self.broken,
                "staleness": {str(k): v for k, v in sorted(self.staleness.items())}}
