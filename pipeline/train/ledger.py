"""The ledger: every offset range a run trained, ``[batch_id, topic, partition, start, end]``,
kept in the checkpoint with the weights that learned from it."""

from __future__ import annotations

from typing import Any

from pipeline.errors import DataError


def check_ledger(ledger: list[list[Any]]) -> dict[tuple[str, int], int]:
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
            raise DataError(f"ledger: {topic}-{part} batch {batch_id} starts at {start} "
                            f"but the previous range ended at {ends[key]}")
        ends[key] = end
    return ends
