"""Kafka's record batch format (magic 2), parsed with vectorized numpy.

The only per-record Python step is walking record lengths; keys, values, offsets and
timestamps come out as flat arrays (Arrow-ready). Compressed batches are inflated with
kafka-python's codecs; control batches (transaction markers) are skipped; CRCs are
checked per batch.
"""

from __future__ import annotations

import dataclasses
import struct

import numpy as np

from pipeline.errors import BrokerError

_BATCH_HEADER = 61
_PAD = 16  # zero bytes after a buffer, so gathering a varint's bytes never runs off the end


def _varints(buf: np.ndarray, pos: np.ndarray, width: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Zigzag varints starting at ``pos`` in ``buf``: (values, sizes in bytes).

    >>> data = np.frombuffer(bytes([0x02, 0x96, 0x01, 0x01]) + bytes(_PAD), np.uint8)
    >>> values, sizes = _varints(data, np.array([0, 1, 3]))
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


def _record_starts(data: bytes, first: int, count: int, limit: int) -> np.ndarray:
    """Where each of ``count`` records begins (walking the length varints)."""
    starts = np.empty(count, np.int64)
    pos = first
    for i in range(count):
        starts[i] = pos
        raw, shift, size = 0, 0, 0
        while True:
            b = data[pos + size]
            raw |= (b & 0x7F) << shift
            size += 1
            if b < 0x80:
                break
            shift += 7
        pos += size + ((raw >> 1) ^ -(raw & 1))
    if pos > limit:
        raise BrokerError("A Kafka record batch is shorter than its records.")
    return starts


def _gather(buf: np.ndarray, pos: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def _decompress(codec: int, payload: bytes) -> bytes:
    import gzip

    if codec == 1:
        return gzip.decompress(payload)
    from kafka import codec as kcodec

    decoders = {2: getattr(kcodec, "snappy_decode", None), 3: getattr(kcodec, "lz4_decode", None),
                4: getattr(kcodec, "zstd_decode", None)}
    decode = decoders.get(codec)
    if decode is None:
        raise BrokerError(f"A Kafka record batch uses compression codec {codec}, which this reader cannot inflate.")
    try:
        return bytes(decode(payload))
    except Exception as e:  # a codec library that is not installed, or corrupt data
        raise BrokerError(f"Cannot inflate a Kafka record batch (codec {codec}): {e}") from None


def parse_batches(records: bytes | memoryview, *, start: int, end: int,
                  check_crc: bool = True) -> tuple[list[Records], int]:
    """Records with ``start <= offset < end`` from a Fetch response's record set, one
    :class:`Records` per record batch; also the offset to fetch next (after the last
    complete batch).

    A trailing partial batch (the broker cuts at its byte limit) is left for the next
    fetch. Only message format v2 (Kafka >= 0.11) is read.
    """
    import crc32c

    size = len(records)
    # One padded copy of the response; uncompressed batches are parsed where they lie
    # (a varint read near a batch's end may look into the next batch: harmless, masked).
    data = bytes(records) + bytes(_PAD)
    view, buf = memoryview(data), np.frombuffer(data, np.uint8)
    pos, next_offset = 0, start
    out: list[Records] = []
    while pos + _BATCH_HEADER <= size:
        base, length = struct.unpack_from(">qi", data, pos)
        stop = pos + 12 + length
        if stop > size:
            break
        magic = data[pos + 16]
        if magic != 2:
            raise BrokerError(f"Kafka sent message format v{magic}; streamtrain reads v2 (Kafka >= 0.11) only.")
        crc, attributes, last_delta, base_ts, max_ts = struct.unpack_from(">Ihiqq", data, pos + 17)
        if check_crc and crc32c.crc32c(view[pos + 21:stop]) != crc:
            raise BrokerError(f"A Kafka record batch at offset {base} failed its CRC check.")
        count = struct.unpack_from(">i", data, pos + 57)[0]
        next_offset = max(next_offset, base + last_delta + 1)
        if count and not attributes & 0x20 and base + last_delta >= start and base < end:  # 0x20: control batch
            codec = attributes & 0x07
            if codec:
                body = _decompress(codec, data[pos + _BATCH_HEADER:stop]) + bytes(_PAD)
                where = (body, np.frombuffer(body, np.uint8), 0, len(body) - _PAD)
            else:
                where = (data, buf, pos + _BATCH_HEADER, stop)
            got = _parse_batch(*where, count, base, base_ts, max_ts if attributes & 0x08 else -1, start, end)
            if len(got):
                out.append(got)
        pos = stop
    return out, next_offset


def _parse_batch(data: bytes, buf: np.ndarray, first: int, stop: int, count: int, base: int, base_ts: int,
                 log_append_ts: int, start: int, end: int) -> Records:
    """The records of one batch, ``data[first:stop]`` after its header (``buf``: the same
    bytes as numpy, padded), whose offsets fall in ``[start, end)``."""
    starts = _record_starts(data, first, count, stop)
    _, size = _varints(buf, starts, 5)  # the record length
    at = starts + size + 1  # skip the attributes byte
    ts_delta, size = _varints(buf, at, 10)
    at += size
    off_delta, size = _varints(buf, at, 5)
    at += size
    key_len, size = _varints(buf, at, 5)
    at += size
    offsets = base + off_delta
    keep = (offsets >= start) & (offsets < end)
    key_at = at
    at = at + np.maximum(key_len, 0)
    value_len, size = _varints(buf, at, 5)
    at += size
    if not keep.all():
        offsets, ts_delta, key_at, key_len, at, value_len = (
            a[keep] for a in (offsets, ts_delta, key_at, key_len, at, value_len))
    key_offsets, key_data = _gather(buf, key_at, key_len)
    value_offsets, value_data = _gather(buf, at, value_len)
    stamps = np.full(len(offsets), log_append_ts, np.int64) if log_append_ts >= 0 else base_ts + ts_delta
    return Records(offsets, stamps, key_offsets, key_data, key_len >= 0, value_offsets, value_data, value_len >= 0)


# --- the reader ---------------------------------------------------------------------------
