"""The ledger: every offset range a run trained, kept in the checkpoint with the weights that
learned from it.

Ranges come in and go out as :class:`~pipeline.ingest.offsets.OffsetRange` (:func:`add`,
:func:`ranges_of`); the entries ``[batch_id, topic, partition, start, end]`` are the
ledger's stored form (JSON in ``state.npz``, and ``report.json``'s ``ledger``), written
and read in this module only.

Compacted as it grows (:func:`compact`): each partition's chained ranges become one, so a
trainer that never stops rewrites a checkpoint of constant size; the newest batch's ranges
stay as they were, to compare a replayed batch against.
"""

from __future__ import annotations

from typing import Any

from pipeline.errors import DataError
from pipeline.ingest.offsets import OffsetRange

#: The stored form: ``[batch_id, topic, partition, start, end]`` per trained range.
Ledger = list[list[Any]]


def add(ledger: Ledger, batch_id: int, ranges: list[OffsetRange]) -> Ledger:
    """The ledger with batch ``batch_id``'s ``ranges`` added, compacted.

    >>> add([[0, "t", 0, 0, 5]], 1, [OffsetRange("t", 0, 5, 9)])
    [[0, 't', 0, 0, 5], [1, 't', 0, 5, 9]]
    """
    return compact(
        ledger + [[batch_id, r.topic, r.partition, r.start, r.end] for r in ranges],
        keep_batch=batch_id,
    )


def ranges_of(ledger: Ledger, batch_id: int) -> list[OffsetRange]:
    """The non-empty ranges the ledger holds for ``batch_id``.

    >>> ranges_of([[0, "t", 0, 0, 5], [1, "t", 0, 5, 9]], 1)
    [OffsetRange(topic='t', partition=0, start=5, end=9)]
    """
    return [
        OffsetRange(t, int(p), int(s), int(e))
        for b, t, p, s, e in ledger
        if b == batch_id and e > s
    ]


def check_ledger(ledger: Ledger) -> dict[tuple[str, int], int]:
    """Verify that trained ranges chain with no gap and no overlap per partition; return the ends.

    >>> check_ledger([[0, "t", 0, 0, 5], [1, "t", 0, 5, 9]])
    {('t', 0): 9}
    >>> check_ledger([[0, "t", 0, 0, 5], [1, "t", 0, 4, 9]])
    Traceback (most recent call last):
    ...
    pipeline.errors.DataError: ledger: t-0 batch 1 starts at 4 but the previous range ended at 5
    """
    ends: dict[tuple[str, int], int] = {}
    for batch_id, topic, part, start, end in ledger:
        key = (topic, int(part))
        if key in ends and start != ends[key]:
            raise DataError(
                f"ledger: {topic}-{part} batch {batch_id} starts at {start} "
                f"but the previous range ended at {ends[key]}"
            )
        ends[key] = end
    return ends


def compact(ledger: Ledger, *, keep_batch: int) -> Ledger:
    """Merge each partition's ranges that follow one another into one range, labelled with
    the last batch it covers; the ranges of batch ``keep_batch`` are left as they are.

    >>> compact(
    ...     [[0, "t", 0, 0, 5], [0, "t", 1, 0, 4], [1, "t", 0, 5, 9], [2, "t", 0, 9, 12]],
    ...     keep_batch=2,
    ... )
    [[1, 't', 0, 0, 9], [0, 't', 1, 0, 4], [2, 't', 0, 9, 12]]
    >>> compact(
    ...     [[0, "t", 0, 0, 5], [3, "t", 0, 7, 9]], keep_batch=9
    ... )  # a gap is kept, for check_ledger to see
    [[0, 't', 0, 0, 5], [3, 't', 0, 7, 9]]
    """
    out: Ledger = []
    last: dict[tuple[str, int], int] = {}
    for batch_id, topic, part, start, end in ledger:
        key = (topic, int(part))
        i = last.get(key)
        if (
            batch_id != keep_batch
            and i is not None
            and out[i][0] != keep_batch
            and out[i][4] == start
        ):
            out[i] = [batch_id, topic, part, out[i][3], end]
        else:
            out.append([batch_id, topic, part, start, end])
            last[key] = len(out) - 1
    return out


def check_replay(
    ledger: Ledger,
    *,
    batch_id: int,
    last_batch_id: int,
    ranges: list[OffsetRange] | None,
    where: str,
) -> None:
    """Refuse to skip a replayed batch the checkpoint did not apply as Spark now replays it.

    Spark replays at most the last batch whose commit it lost, with the offsets it logged:
    so a replay of an older batch, or of the last one over other ranges, means Spark's
    checkpoint and ``state.npz`` are not from the same run (one was reset or copied), and
    skipping would drop records that were never trained.

    >>> check_replay([[4, "t", 0, 10, 20]], batch_id=4, last_batch_id=4, ranges=None, where="out")
    >>> check_replay(
    ...     [[4, "t", 0, 10, 20]], batch_id=0, last_batch_id=4, ranges=None, where="out"
    ... )  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    pipeline.errors.DataError: Spark replays batch 0, but the checkpoint in out holds batches up to
    4: Spark's checkpoint (out/spark-checkpoint) does not belong with state.npz. Restore both from
    the same moment, or train into a new --out.
    """
    if batch_id < last_batch_id:
        raise DataError(
            f"Spark replays batch {batch_id}, but the checkpoint in {where} holds batches up to "
            f"{last_batch_id}: Spark's checkpoint ({where}/spark-checkpoint) does not belong with "
            "state.npz. Restore both from the same moment, or train into a new --out."
        )
    if ranges is None:
        return
    applied = sorted(ranges_of(ledger, batch_id), key=_order)
    replayed = sorted((r for r in ranges if r.count > 0), key=_order)
    if applied != replayed:
        raise DataError(
            f"Spark replays batch {batch_id} over {_ranges(replayed)}, but the checkpoint in "
            f"{where} applied batch {batch_id} over {_ranges(applied)}: Spark's checkpoint does "
            "not belong with state.npz. Restore both from the same moment, or train into a new "
            "--out."
        )


def _order(r: OffsetRange) -> tuple[str, int, int, int]:
    return r.topic, r.partition, r.start, r.end


def _ranges(ranges: list[OffsetRange]) -> str:
    return ", ".join(f"{r.topic}-{r.partition}[{r.start}, {r.end})" for r in ranges) or "nothing"
