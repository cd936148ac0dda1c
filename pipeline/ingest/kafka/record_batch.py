"""Kafka's record batch format (magic 2): the batches of a Fetch response, their records as
columns (:mod:`pipeline.ingest.kafka.records`). Compressed batches are inflated by
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
from pipeline.ingest.kafka.records import (
    PAD,
    Records,
    columns,
    concat,
    record_starts,
)

__all__ = ["ON_POISON", "Records", "Skipped", "UnreadableBatch", "parse_batches"]

_BATCH_HEADER = 61
#: Bytes of keys (or of values) joined into one set at most: Arrow's binary offsets are int32.
_MOST_JOINED = 1 << 30


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
    """Records with ``start <= offset < end`` from a Fetch response's record set, as one
    :class:`Records` (none where it holds none, more past 1 GiB of keys or values); also the
    offset to fetch next (after the last complete batch, or where the range ends).

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
    data = bytes(records) + bytes(PAD)
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
        if base >= end:
            # Past the range: only where it begins (the range's gaps end there), unchecked. A
            # Fetch answers up to its byte limit: thousands of small batches more.
            found.append((pos, stop, base))
            headers.append((base, -1, 0, ""))
            next_offset = max(next_offset, base)
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
    # Consecutive uncompressed batches are parsed together, one numpy pass over all their
    # records: a producer at a low rate per partition (librdkafka's 5 ms linger) writes
    # batches of a few records, and per-batch numpy calls cost ~0.6 ms a batch here.
    plain = _Plain(data, buf)
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
        if not attributes & 0x07:
            try:
                plain.add(pos, stop, count, attributes, base, last)
            except (BrokerError, IndexError, ValueError) as e:
                out.extend(plain.parse(start, end, skipped, on_poison))  # those before it first
                _poisoned(e, base, last, start, end, skipped, on_poison)
            continue
        out.extend(plain.parse(start, end, skipped, on_poison))  # in offset order
        try:
            got = _read_batch(data, pos, stop, count, attributes, start, end, max_batch_bytes)
        except (BrokerError, IndexError, ValueError) as e:
            _poisoned(e, base, last, start, end, skipped, on_poison)
            continue
        if len(got):
            out.append(got)
    out.extend(plain.parse(start, end, skipped, on_poison))
    return _merged(out), next_offset


def _merged(parts: list[Records]) -> list[Records]:
    """Consecutive parts joined while their keys and values stay within Arrow's int32
    offsets (a response of large compressed batches can inflate past 2 GiB)."""
    out: list[Records] = []
    run: list[Records] = []
    size = 0
    for part in parts:
        more = max(len(part.key_data), len(part.value_data))
        if run and size + more >= _MOST_JOINED:
            out.append(concat(run) if len(run) > 1 else run[0])
            run, size = [], 0
        run.append(part)
        size += more
    if run:
        out.append(concat(run) if len(run) > 1 else run[0])
    return out


def _poisoned(
    e: Exception, base: int, last: int, start: int, end: int, skipped: Skipped, on_poison: str
) -> None:
    """A batch ``[base, last]`` that failed to parse: raise, or pass over it."""
    cause = str(e) if isinstance(e, BrokerError) else "corrupt batch: its records are cut short"
    if on_poison != "skip":
        raise UnreadableBatch(base, cause) from None
    skipped.pass_over(base, last, start, end, cause)


class _Plain:
    """Uncompressed batches of one response, gathered to be parsed in one pass."""

    def __init__(self, data: bytes, buf: np.ndarray) -> None:
        self.data, self.buf = data, buf
        # Per batch: its records' starts, base offset, base and log-append time, last offset.
        self.batches: list[tuple[np.ndarray, int, int, int, int]] = []

    def add(self, pos: int, stop: int, count: int, attributes: int, base: int, last: int) -> None:
        """Walk the batch at ``data[pos:stop]`` to its records (raises if it is cut short)."""
        starts = record_starts(self.data, pos + _BATCH_HEADER, count, stop)
        self.batches.append((starts, base, *_times(self.data, pos, attributes), last))

    def parse(self, start: int, end: int, skipped: Skipped, on_poison: str) -> list[Records]:
        """The gathered batches' records in ``[start, end)`` (none left gathered after)."""
        batches, self.batches = self.batches, []
        if not batches:
            return []
        counts = [len(b[0]) for b in batches]
        try:
            bases, stamps, appended = (
                np.repeat([b[k] for b in batches], counts) for k in (1, 2, 3)
            )
            starts = np.concatenate([b[0] for b in batches])
            got = columns(self.buf, starts, bases, stamps, appended, start, end)
            return [got] if len(got) else []
        except (BrokerError, IndexError, ValueError):
            pass
        # One of them is malformed: each alone, so that the error names its batch.
        out = []
        for starts, base, base_ts, log_append, last in batches:
            try:
                got = columns(self.buf, starts, base, base_ts, log_append, start, end)
            except (BrokerError, IndexError, ValueError) as e:
                _poisoned(e, base, last, start, end, skipped, on_poison)
                continue
            if len(got):
                out.append(got)
        return out


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


def _times(data: bytes, pos: int, attributes: int) -> tuple[int, int]:
    """The batch at ``pos``'s base timestamp and, with LogAppendTime, the time every record
    reads (else -1)."""
    base_ts, max_ts = struct.unpack_from(">qq", data, pos + 27)
    return base_ts, max_ts if attributes & 0x08 else -1


def _read_batch(
    data: bytes,
    pos: int,
    stop: int,
    count: int,
    attributes: int,
    start: int,
    end: int,
    max_batch_bytes: int,
) -> Records:
    """The records of the compressed batch at ``data[pos:stop]``, inflated (uncompressed
    ones are parsed together: :class:`_Plain`)."""
    (base,) = struct.unpack_from(">q", data, pos)
    body = compression.inflate(
        attributes & 0x07,
        memoryview(data)[pos + _BATCH_HEADER : stop],
        max_bytes=max_batch_bytes,
        pad=PAD,
        out=_scratch(max_batch_bytes + 1 + PAD),
    )
    starts = record_starts(body.data, 0, count, len(body) - PAD)
    return columns(body, starts, base, *_times(data, pos, attributes), start, end)
