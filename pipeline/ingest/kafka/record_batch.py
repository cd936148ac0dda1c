"""Kafka's record batch format (magic 2), parsed with vectorized numpy.

The only per-record Python step is walking record lengths; keys, values, offsets and
timestamps come out as flat arrays (Arrow-ready). Compressed batches are inflated by
:mod:`pipeline.ingest.kafka.compression` (every codec of Kafka's, under a size cap);
control batches (transaction markers) are skipped, and so are aborted transactions'
records for a read_committed reader (:mod:`pipeline.ingest.kafka.transactions`); CRCs are
checked per batch.
"""

from __future__ import annotations

import dataclasses
import struct
import threading

import numpy as np

from pipeline.errors import BrokerError
from pipeline.ingest.kafka import compression, transactions

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


def _record_starts(data: bytes | memoryview, first: int, count: int, limit: int) -> np.ndarray:
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


class UnreadableBatch(BrokerError):
    """A record batch this reader cannot read: an unknown or corrupt codec payload, a
    record format before v2, a failed CRC, records cut short. Never retried: the same
    bytes fail the same way, so the range cannot be read as it is.

    Attributes:
        offset: the batch's first offset.
        cause: what is wrong with it.
    """

    def __init__(self, offset: int, cause: str) -> None:
        super().__init__(f"the record batch at offset {offset} cannot be read: {cause}")
        self.offset, self.cause = offset, cause


@dataclasses.dataclass
class Skipped:
    """What reading a range left out on purpose, added up over the fetches of one read.

    Attributes:
        aborted: records of aborted transactions (read_committed).
        control: transaction markers (control records; never data).
        first: the first offset of the range that any batch held (None until one did);
            above the range's start, the head of the range is gone from the log.
        poisoned: offsets of unreadable batches passed over (``on_poison="skip"``).
        poison: per such batch, ``(first, last, cause)`` (its offsets inside the range).
    """

    aborted: int = 0
    control: int = 0
    first: int | None = None
    poisoned: int = 0
    poison: list[tuple[int, int, str]] = dataclasses.field(default_factory=list)

    def pass_over(self, base: int, last: int, start: int, end: int, cause: str) -> None:
        """Count an unreadable batch ``[base, last]`` as passed over, the part in
        ``[start, end)``."""
        lo, hi = max(base, start), min(last, end - 1)
        if hi >= lo:
            self.poisoned += hi - lo + 1
            self.poison.append((lo, hi, cause))
            self.first = lo if self.first is None else self.first


#: What a reader does with a batch it cannot read: stop (``fail``), or pass over it and
#: count it (``skip``).
ON_POISON = ("fail", "skip")


def parse_batches(
    records: bytes | memoryview,
    *,
    start: int,
    end: int,
    check_crc: bool = True,
    aborted: list[tuple[int, int]] | None = None,
    skipped: Skipped | None = None,
    max_batch_bytes: int = compression.DEFAULT_MAX_BYTES,
    on_poison: str = "fail",
) -> tuple[list[Records], int]:
    """Records with ``start <= offset < end`` from a Fetch response's record set, one
    :class:`Records` per record batch; also the offset to fetch next (after the last
    complete batch).

    A trailing partial batch (the broker cuts at its byte limit) is left for the next
    fetch. Only message format v2 (Kafka >= 0.11) is read. Control batches (transaction
    markers) are skipped; with ``aborted`` (read_committed: the fetch response's aborted
    transactions, (producer id, first offset)) so are the records of aborted
    transactions. What was skipped in the range is added to ``skipped``.

    With ``on_poison="skip"``, a batch that cannot be read is passed over instead, its
    offsets and cause added to ``skipped`` (:meth:`Skipped.pass_over`).

    Raises:
        UnreadableBatch: a batch that cannot be read (its offset and why), with
            ``on_poison="fail"``.
    """
    import crc32c

    size = len(records)
    skipped = skipped if skipped is not None else Skipped()
    # One padded copy of the response; uncompressed batches are parsed where they lie
    # (a varint read near a batch's end may look into the next batch: harmless, masked).
    data = bytes(records) + bytes(_PAD)
    view, buf = memoryview(data), np.frombuffer(data, np.uint8)
    pos, next_offset = 0, start
    found: list[tuple[int, int, int]] = []  # pos, stop, base
    headers: list[tuple[int, int, int, str]] = []  # last offset, producer id, attributes, marker
    poisoned: dict[int, str] = {}  # index in found -> why it cannot be read (on_poison="skip")
    while pos + _BATCH_HEADER <= size:
        base, length = struct.unpack_from(">qi", data, pos)
        stop = pos + 12 + length
        if stop > size or length < _BATCH_HEADER - 12:
            if (
                length < _BATCH_HEADER - 12
            ):  # a length that cannot be a batch: no boundary to go on from
                raise UnreadableBatch(base, f"corrupt batch: a length of {length} bytes")
            break
        magic = data[pos + 16]
        crc, attributes, last_delta = struct.unpack_from(">Ihi", data, pos + 17)
        producer, count = (
            struct.unpack_from(">q", data, pos + 43)[0],
            struct.unpack_from(">i", data, pos + 57)[0],
        )
        marker, bad = "", None
        if magic != 2:
            bad = f"record format v{magic}; streamtrain reads v2 (Kafka >= 0.11) only"
        elif check_crc and crc32c.crc32c(view[pos + 21 : stop]) != crc:
            bad = "corrupt batch: it failed its CRC check"
        elif attributes & 0x20 and count:
            try:
                marker = (
                    "abort" if transactions.is_abort_marker(data, pos + _BATCH_HEADER) else "commit"
                )
            except IndexError:
                bad = "corrupt batch: a control record is cut short"
        if bad is not None:
            if on_poison != "skip":
                raise UnreadableBatch(base, bad)
            # Past the CRC the header cannot be trusted: one offset, unless it says a sane span.
            last_delta = last_delta if magic == 2 and 0 <= last_delta < max(length, 1) else 0
            poisoned[len(found)] = bad
            attributes, producer = 0, -1
        found.append((pos, stop, base))
        headers.append((base + last_delta, producer, attributes, marker))
        next_offset = max(next_offset, base + last_delta + 1)
        pos = stop
    keep = (
        transactions.filter_aborted(headers, aborted)
        if aborted is not None
        else [not h[2] & 0x20 for h in headers]
    )
    # A broker that filters aborted records itself (noida) leaves a gap where they were:
    # counted as aborted where the response lists an aborted transaction before it
    # (other gaps are compaction's, and not this reader's to count).
    abort_from = min((first for _, first in aborted), default=None) if aborted else None
    out: list[Records] = []
    expected = start
    for i, ((pos, stop, base), (last, _, attributes, _), kept) in enumerate(
        zip(found, headers, keep, strict=True)
    ):
        if i in poisoned:
            skipped.pass_over(base, last, start, end, poisoned[i])
            expected = max(expected, last + 1)
            continue
        gap_from, gap_to = max(expected, start), min(base, end)
        if abort_from is not None and gap_to > gap_from and abort_from < base:
            skipped.aborted += gap_to - gap_from
            skipped.first = gap_from if skipped.first is None else skipped.first
        expected = max(expected, last + 1)
        count = struct.unpack_from(">i", data, pos + 57)[0]
        if not count or last < start or base >= end:
            continue
        if skipped.first is None:
            skipped.first = max(base, start)
        if not kept:
            overlap = min(count, min(last, end - 1) - max(base, start) + 1)
            if attributes & 0x20:
                skipped.control += overlap
            else:
                skipped.aborted += overlap
            continue
        try:
            got = _read_batch(data, buf, pos, stop, count, attributes, start, end, max_batch_bytes)
        except (BrokerError, IndexError, ValueError) as e:
            cause = (
                str(e) if isinstance(e, BrokerError) else "corrupt batch: its records are cut short"
            )
            if on_poison != "skip":
                raise UnreadableBatch(base, cause) from None
            skipped.pass_over(base, last, start, end, cause)
            continue
        if len(got):
            out.append(got)
    return out, next_offset


_SCRATCH = threading.local()


def _scratch(size: int) -> np.ndarray:
    """This thread's buffer to inflate batches into, reused: the records are copied out of
    it as they are parsed, and inflating into pages mapped already made zstd MNIST batches
    parse ~1.4x faster here than into a fresh buffer each (only the pages the largest batch
    touched stay resident)."""
    buf: np.ndarray | None = getattr(_SCRATCH, "buf", None)
    if buf is None or len(buf) < size:
        buf = _SCRATCH.buf = np.empty(size, np.uint8)
    return buf


def _read_batch(
    data: bytes,
    buf: np.ndarray,
    pos: int,
    stop: int,
    count: int,
    attributes: int,
    start: int,
    end: int,
    max_batch_bytes: int,
) -> Records:
    """The records of the batch at ``data[pos:stop]``, inflated where compressed."""
    (base,) = struct.unpack_from(">q", data, pos)
    base_ts, max_ts = struct.unpack_from(">qq", data, pos + 27)
    log_append_ts = max_ts if attributes & 0x08 else -1
    codec = attributes & 0x07
    if not codec:
        return _parse_batch(
            data, buf, pos + _BATCH_HEADER, stop, count, base, base_ts, log_append_ts, start, end
        )
    body = compression.inflate(
        codec,
        memoryview(data)[pos + _BATCH_HEADER : stop],
        max_bytes=max_batch_bytes,
        pad=_PAD,
        out=_scratch(max_batch_bytes + 1 + _PAD),
    )
    return _parse_batch(
        body.data, body, 0, len(body) - _PAD, count, base, base_ts, log_append_ts, start, end
    )


def _parse_batch(
    data: bytes | memoryview,
    buf: np.ndarray,
    first: int,
    stop: int,
    count: int,
    base: int,
    base_ts: int,
    log_append_ts: int,
    start: int,
    end: int,
) -> Records:
    """The records of one batch, ``data[first:stop]`` after its header (``buf``: the same
    bytes as numpy, padded), whose offsets fall in ``[start, end)``."""
    # A record takes 7 bytes at least (its length, attributes, two deltas, key and value
    # lengths, header count): the header's count sizes nothing its bytes cannot hold.
    if not 0 <= count <= (stop - first) // 7:
        raise BrokerError(f"corrupt batch: it declares {count:,} records in {stop - first:,} bytes")
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
            a[keep] for a in (offsets, ts_delta, key_at, key_len, at, value_len)
        )
    key_offsets, key_data = _gather(buf, key_at, key_len)
    value_offsets, value_data = _gather(buf, at, value_len)
    stamps = (
        np.full(len(offsets), log_append_ts, np.int64) if log_append_ts >= 0 else base_ts + ts_delta
    )
    return Records(
        offsets,
        stamps,
        key_offsets,
        key_data,
        key_len >= 0,
        value_offsets,
        value_data,
        value_len >= 0,
    )
