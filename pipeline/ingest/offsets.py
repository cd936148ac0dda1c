"""Offset planning: which records ``[start, end)`` of which partitions one micro-batch reads.

The one planner of streamtrain: the Python Spark source plans its input partitions with
:func:`plan`, and the micro-batch driver plans the tasks it runs with the same call on
the same offsets, so both always cut a batch alike. Offsets are Spark's Kafka JSON
form, ``{"topic": {"0": 42}}``: the next offset to read, per partition.

Example:
    >>> plan(
    ...     {"t": {"0": 0, "1": 5}}, {"t": {"0": 100, "1": 5}}, min_partitions=2
    ... )  # doctest: +NORMALIZE_WHITESPACE
    [OffsetRange(topic='t', partition=0, start=0, end=50), OffsetRange(topic='t', partition=0,
    start=50, end=100)]
"""

from __future__ import annotations

import dataclasses

from pyspark.sql.datasource import InputPartition

#: ``{"topic": {"partition": next offset}}``, as Spark's Kafka sources log them.
Offsets = dict[str, dict[str, int]]
#: A topic partition, ``(topic, partition)``: what per-partition figures (lag) are keyed by.
TopicPartition = tuple[str, int]


@dataclasses.dataclass(frozen=True)
class PassedOver:
    """An unreadable record batch passed over (``--on-poison skip``): its offsets
    ``[first, last]`` inside a task's range, and why it could not be read."""

    topic: str
    partition: int
    first: int
    last: int
    cause: str


@dataclasses.dataclass(frozen=True)
class OffsetRange(InputPartition):
    """Records ``[start, end)`` of one topic partition: one Spark task.

    (An ``InputPartition`` so that the Python source can hand it to Spark as it is.)
    """

    topic: str
    partition: int
    start: int
    end: int

    @property
    def count(self) -> int:
        return self.end - self.start

    @property
    def topic_partition(self) -> TopicPartition:
        return self.topic, self.partition


def plan(start: Offsets, end: Offsets, *, min_partitions: int = 0) -> list[OffsetRange]:
    """The ranges from ``start`` to ``end`` (a partition missing from ``start`` is read
    from 0), split until there are at least ``min_partitions``; empty ranges dropped.

    >>> plan({"t": {"0": 3}}, {"t": {"0": 3, "1": 2}})
    [OffsetRange(topic='t', partition=1, start=0, end=2)]
    """
    ranges = [
        OffsetRange(topic, int(p), int(start.get(topic, {}).get(p, 0)), int(e))
        for topic, parts in end.items()
        for p, e in parts.items()
    ]
    return split_ranges([r for r in ranges if r.count > 0], min_partitions)


def split_ranges(ranges: list[OffsetRange], min_partitions: int) -> list[OffsetRange]:
    """Split the largest ranges until there are at least ``min_partitions``.

    >>> [
    ...     r.count
    ...     for r in split_ranges([OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 0, 10)], 3)
    ... ]
    [50, 50, 10]
    """
    out = sorted(ranges, key=lambda r: (r.topic, r.partition, r.start))
    while len(out) < min_partitions:
        big = max(out, key=lambda r: r.count, default=None)
        if big is None or big.count < 2:
            break
        mid = big.start + big.count // 2
        i = out.index(big)
        out[i : i + 1] = [dataclasses.replace(big, end=mid), dataclasses.replace(big, start=mid)]
    return out


def merge_ranges(ranges: list[OffsetRange]) -> list[OffsetRange]:
    """Join adjacent ranges of one partition (split for parallelism) back into one.

    >>> merge_ranges(
    ...     [OffsetRange("t", 0, 5, 9), OffsetRange("t", 0, 0, 5), OffsetRange("t", 1, 0, 2)]
    ... )  # doctest: +NORMALIZE_WHITESPACE
    [OffsetRange(topic='t', partition=0, start=0, end=9), OffsetRange(topic='t', partition=1,
    start=0, end=2)]
    """
    out: list[OffsetRange] = []
    for r in sorted(ranges, key=lambda r: (r.topic, r.partition, r.start)):
        last = out[-1] if out else None
        if (
            last is not None
            and (last.topic, last.partition) == (r.topic, r.partition)
            and last.end == r.start
        ):
            out[-1] = dataclasses.replace(last, end=r.end)
        else:
            out.append(r)
    return out


def cap_offsets(start: Offsets, end: Offsets, max_rows: int) -> Offsets:
    """Limit ``end`` so at most ``max_rows`` records lie between ``start`` and it, spread over
    partitions in proportion to what each has (as Spark's Kafka source does).

    >>> cap_offsets({"t": {"0": 0, "1": 0}}, {"t": {"0": 300, "1": 100}}, 100)
    {'t': {'0': 75, '1': 25}}
    """
    pending = {
        (t, p): e - start.get(t, {}).get(p, 0) for t, parts in end.items() for p, e in parts.items()
    }
    total = sum(n for n in pending.values() if n > 0)
    if total <= max_rows:
        return end
    share = {k: (n * max_rows) // total if n > 0 else 0 for k, n in pending.items()}
    # Hand out what integer division left, largest backlog first, so the cap is met exactly.
    left = max_rows - sum(share.values())
    for k in sorted(pending, key=lambda k: -pending[k]):
        if left <= 0:
            break
        if share[k] < pending[k]:
            share[k] += 1
            left -= 1
    capped: Offsets = {}
    for (t, p), n in share.items():
        capped.setdefault(t, {})[p] = (
            start.get(t, {}).get(p, 0) + n if pending[(t, p)] > 0 else end[t][p]
        )
    return capped
