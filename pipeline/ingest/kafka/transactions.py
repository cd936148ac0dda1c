"""Kafka's transactions as a read_committed reader sees them: ABORT markers, and the batches
of aborted transactions left out, decided as Kafka's Java consumer decides.

:mod:`~pipeline.ingest.kafka.record_batch` reads each batch's header and asks this module
which batches it keeps.
"""

from __future__ import annotations

import struct

from pipeline.ingest.kafka.records import varint


def is_abort_marker(data: bytes, first: int) -> bool:
    """Whether the control record at ``first`` is an ABORT marker (its key: version int16,
    type int16, where 0 is ABORT and 1 COMMIT).

    >>> record = bytes([20, 0, 0, 0, 8]) + struct.pack(">hh", 0, 0)
    >>> is_abort_marker(record, 0)
    True
    """
    pos = first + varint(data, first)[1] + 1  # the record's length, its attributes
    pos += varint(data, pos)[1]  # timestamp delta
    pos += varint(data, pos)[1]  # offset delta
    key_len, size = varint(data, pos)
    if key_len < 4:
        return False
    return bool(struct.unpack_from(">h", data, pos + size + 2)[0] == 0)


def filter_aborted(
    batches: list[tuple[int, int, int, str]], aborted: list[tuple[int, int]]
) -> list[bool]:
    """Which batches a read_committed consumer keeps, decided as Kafka's Java consumer does.

    A producer's transactional batches are dropped from the first offset of one of its
    aborted transactions (the fetch response lists them) until that producer's ABORT
    marker; control batches are never kept.

    Args:
        batches: per batch in log order, (last offset, producer id, attributes,
            marker: "abort", "commit" or "" for data).
        aborted: (producer id, first offset) of the aborted transactions the broker listed.

    Returns:
        One flag per batch: keep it.

    Example:
        >>> txn = 0x10  # the transactional bit of the attributes
        >>> log = [(0, 7, txn, ""), (1, 8, txn, ""), (2, 7, txn | 0x20, "abort"), (3, 7, txn, ""),
        ...        (4, 7, txn | 0x20, "commit"), (5, -1, 0, "")]
        >>> filter_aborted(log, [(7, 0)])
        [False, True, False, True, False, True]
    """
    pending = sorted(aborted, key=lambda a: a[1])
    active: set[int] = set()
    keep = []
    for last, producer, attributes, marker in batches:
        if attributes & 0x10:
            while pending and pending[0][1] <= last:
                active.add(pending.pop(0)[0])
        if attributes & 0x20:
            if marker == "abort":
                active.discard(producer)
            keep.append(False)
        else:
            keep.append(not (attributes & 0x10 and producer in active))
    return keep
