"""The model's freshness: how old the newest data is whose update the center holds.

Every record carries Kafka's timestamp (CreateTime, or LogAppendTime where the topic is set
so: the record batch says which, and the reader takes it) to the task that trains it; each
task reports the newest of its range. Per partition, the center holds the newest timestamp
of every batch it applied; the model's freshness at time ``t`` is ``t`` minus the oldest
partition's.

A quiet partition (nothing in the batch, nothing left to read: lag 0) bounds nothing: the
center holds all it has, and an old timestamp there would make a model that learned
everything look stale. Where every partition is quiet, the newest timestamp of all bounds
it: on a stream that went quiet, freshness grows, which is true (nothing newer was learned)
and why the ``StreamtrainModelStale`` alert also asks for a lag. (A partition that had
records in the batch always counts: a lag of 0 is read up to a second late.)

Example:
    >>> f = Freshness()
    >>> f.learn({("t", 0): 10_000, ("t", 1): 8_000}, lag={("t", 0): 5, ("t", 1): 5})
    >>> f.as_of, f.seconds(now=12.5)
    (8.0, 4.5)
    >>> f.learn({("t", 0): 11_000}, lag={("t", 0): 0, ("t", 1): 5})
    >>> f.seconds(now=12.5)
    4.5
    >>> f.learn({}, lag={("t", 0): 0, ("t", 1): 0})
    >>> f.seconds(now=12.5)
    1.5
    >>> Freshness.from_state(f.state()).as_of
    11.0
"""

from __future__ import annotations

from typing import Any

from pipeline.ingest.offsets import TopicPartition


class Freshness:
    """The newest learned timestamp per partition, and the bound they make.

    Args:
        newest_ms: per topic partition, the newest record timestamp (ms) the center holds.
        as_of: the bound (Unix seconds): every partition's learned data reaches at least it.
    """

    def __init__(
        self, newest_ms: dict[TopicPartition, int] | None = None, as_of: float | None = None
    ) -> None:
        self.newest_ms: dict[TopicPartition, int] = dict(newest_ms or {})
        self.as_of = as_of

    def learn(
        self, newest_ms: dict[TopicPartition, int], *, lag: dict[TopicPartition, int]
    ) -> None:
        """The center now holds a batch whose records' newest timestamps per partition are
        ``newest_ms``; ``lag``: the records left per partition when it ended (a partition
        missing from it counts as lagging: unknown is not caught up)."""
        for tp, ms in newest_ms.items():
            self.newest_ms[tp] = max(ms, self.newest_ms.get(tp, ms))
        if not self.newest_ms:
            return
        bounding = [
            ms for tp, ms in self.newest_ms.items() if tp in newest_ms or lag.get(tp, 1) > 0
        ]
        self.as_of = (min(bounding) if bounding else max(self.newest_ms.values())) / 1000

    def seconds(self, now: float) -> float | None:
        """Freshness at Unix time ``now`` (None before anything was learned); never below 0
        (a producer's clock ahead of this one's).

        >>> Freshness(as_of=100.0).seconds(now=99.0), Freshness().seconds(now=1.0)
        (0.0, None)
        """
        return None if self.as_of is None else max(0.0, now - self.as_of)

    def state(self) -> dict[str, Any]:
        """What the checkpoint keeps (JSON: partitions as ``topic:partition``)."""
        return {
            "as_of": self.as_of,
            "newest_ms": {f"{t}:{p}": ms for (t, p), ms in self.newest_ms.items()},
        }

    @classmethod
    def from_state(cls, state: dict[str, Any] | None) -> Freshness:
        """Read :meth:`state` back (an older checkpoint's none: nothing learned yet)."""
        if not state:
            return cls()
        newest = {}
        for key, ms in state.get("newest_ms", {}).items():
            topic, _, part = key.rpartition(":")
            newest[(topic, int(part))] = int(ms)
        return cls(newest, state.get("as_of"))
