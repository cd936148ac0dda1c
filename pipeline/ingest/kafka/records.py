"""Kafka records (inside a record batch, format v2) as columns, parsed with vectorized numpy.

The only per-record Python step is walking record lengths (:func:`record_starts`); keys,
values, offsets and timestamps come out as flat arrays (Arrow-ready), for one batch's records
or for many batches' at once (:mod:`pipeline.ingest.kafka.record_batch` reads the batches).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pipeline.errors import BrokerError

PAD = 16  # zero bytes after a buffer, so gathering a varint's bytes never runs off the end


def varints(buf: np.ndarray, pos: np.ndarray, width: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Zigzag varints starting at ``pos`` in ``buf``: (values, sizes in bytes).

    >>> data = np.frombuffer(bytes([0x02, 0x96, 0x01, 0x01]) + bytes(PAD), np.uint8)
    >>> values, sizes = varints(data, np.array([0, 1, 3]))
    >>> values.tolist(), sizes.tolist()
    ([1, 75, -1], [1, 2, 1])
    """
    window = buf[pos[:, None] + np.arange(width)]
    more = (window & 0x80) != 0
    sizes = np.argmin(more, axis=1) + 1
    if more.all(axis=1).any():
        raise BrokerError("A Kafka record has a malformed varint.")
    shifts = (7 * np.arange(width)).astype(np.uint64)
    parts = (window & 0x7F).astype(np.uint64) << shifts
    raw = np.where(np.arange(width) < sizes[:, None], parts, 0).sum(axis=1, dtype=np.uint64)
    values = (raw >> np.uint64(1)).astype(np.int64) ^ -(raw & np.uint64(1)).astype(np.int64)
    return values, sizes


def varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """One zigzag varint at ``pos``: (value, size in bytes).

    >>> varint(bytes([0x96, 0x01]), 0)
    (75, 2)
    """
    raw, shift, size = 0, 0, 0
    while True:
        b = data[pos + size]
        raw |= (b & 0x7F) << shift
        size += 1
        if b < 0x80:
            return (raw >> 1) ^ -(raw & 1), size
        shift += 7


def record_starts(data: bytes | memoryview, first: int, count: int, limit: int) -> np.ndarray:
    """Where each of ``count`` records in ``data[first:limit]`` begins (walking the length
    varints); a count or records that the bytes cannot hold raise."""
    # A record takes 7 bytes at least (its length, attributes, two deltas, key and value
    # lengths, header count): the header's count sizes nothing its bytes cannot hold.
    if not 0 <= count <= (limit - first) // 7:
        raise BrokerError(
            f"corrupt batch: it declares {count:,} records in {limit - first:,} bytes"
        )
    starts = np.empty(count, np.int64)
    pos = first
    for i in range(count):
        starts[i] = pos
        length, size = varint(data, pos)
        pos += size + length
    if pos > limit:
        raise BrokerError("A Kafka record batch is shorter than its records.")
    return starts


def gather(buf: np.ndarray, pos: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate ``buf[pos[i] : pos[i] + lengths[i]]`` (lengths < 0: null, empty);
    return (Arrow int32 offsets, bytes)."""
    n = np.maximum(lengths, 0)
    offsets = np.zeros(len(n) + 1, np.int64)
    np.cumsum(n, out=offsets[1:])
    total = int(offsets[-1])
    if total and (n == n[0]).all():  # one length for all: a 2-D gather, no repeats
        data = buf[pos[:, None] + np.arange(n[0])].ravel()
    else:
        data = buf[np.arange(total) - np.repeat(offsets[:-1], n) + np.repeat(pos, n)]
    return offsets.astype(np.int32), data


@dataclasses.dataclass
class Records:
    """Parsed records of one fetch, as columns (Arrow-ready)."""

    offsets: np.ndarray  # int64
    timestamps_ms: np.ndarray  # int64
    key_offsets: np.ndarray  # int32, n + 1
    key_data: np.ndarray  # uint8
    key_valid: np.ndarray  # bool
    value_offsets: np.ndarray
    value_data: np.ndarray
    value_valid: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets)


def concat(parts: list[Records]) -> Records:
    """Records in order as one.

    >>> one = lambda o: Records(np.array([o]), np.array([o]), np.array([0, 1], np.int32),
    ...     np.array([o], np.uint8), np.array([True]), np.array([0, 0], np.int32),
    ...     np.zeros(0, np.uint8), np.array([False]))
    >>> both = concat([one(3), one(4)])
    >>> both.offsets.tolist(), both.key_offsets.tolist(), both.key_data.tolist()
    ([3, 4], [0, 1, 2], [3, 4])
    """

    def offsets(name: str) -> np.ndarray:
        arrays = [getattr(p, name) for p in parts]
        shifts = np.cumsum([0] + [int(a[-1]) for a in arrays[:-1]])
        return np.concatenate(
            [arrays[0][:1]] + [a[1:] + np.int32(s) for a, s in zip(arrays, shifts, strict=True)]
        ).astype(np.int32)

    def joined(name: str) -> np.ndarray:
        return np.concatenate([getattr(p, name) for p in parts])

    return Records(
        joined("offsets"),
        joined("timestamps_ms"),
        offsets("key_offsets"),
        joined("key_data"),
        joined("key_valid"),
        offsets("value_offsets"),
        joined("value_data"),
        joined("value_valid"),
    )


def columns(
    buf: np.ndarray,
    starts: np.ndarray,
    base: int | np.ndarray,
    base_ts: int | np.ndarray,
    log_append_ts: int | np.ndarray,
    start: int,
    end: int,
) -> Records:
    """The records beginning at ``starts`` in ``buf`` whose offsets fall in ``[start, end)``;
    ``base``, ``base_ts`` and ``log_append_ts`` (-1: none) are their batches' header fields,
    one for all or one per record."""
    _, size = varints(buf, starts, 5)  # the record length
    at = starts + size + 1  # skip the attributes byte
    ts_delta, size = varints(buf, at, 10)
    at += size
    off_delta, size = varints(buf, at, 5)
    at += size
    key_len, size = varints(buf, at, 5)
    at += size
    offsets = base + off_delta
    keep = (offsets >= start) & (offsets < end)
    key_at = at
    at = at + np.maximum(key_len, 0)
    value_len, size = varints(buf, at, 5)
    at += size
    if not keep.all():
        offsets, ts_delta, key_at, key_len, at, value_len = (
            a[keep] for a in (offsets, ts_delta, key_at, key_len, at, value_len)
        )
        if np.ndim(base_ts):
            base_ts, log_append_ts = np.asarray(base_ts)[keep], np.asarray(log_append_ts)[keep]
    key_offsets, key_data = gather(buf, key_at, key_len)
    value_offsets, value_data = gather(buf, at, value_len)
    stamps = np.where(log_append_ts >= 0, log_append_ts, base_ts + ts_delta).astype(np.int64)
    return Records(
        np.asarray(offsets, np.int64),
        stamps,
        key_offsets,
        key_data,
        key_len >= 0,
        value_offsets,
        value_data,
        value_len >= 0,
    )
