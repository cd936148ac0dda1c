"""Record batches built byte by byte, and a raw Produce request to send them: for batches
no client would write (a corrupt codec payload with a valid CRC, a compression bomb, an
unknown codec, an old record format), which a broker stores as they are."""

from __future__ import annotations

import struct
import time

import crc32c

from pipeline.ingest.kafka import compression
from pipeline.ingest.kafka.wire import Connection as _Connection
from pipeline.ingest.kafka.wire import string as _string


def _varint(n: int) -> bytes:
    z, out = (n << 1) ^ (n >> 63), b""
    while True:
        b, z = z & 0x7F, z >> 7
        out += bytes([b | (0x80 if z else 0)])
        if not z:
            return out


def records_body(
    records: list[tuple[bytes | None, bytes | None]], deltas_ms: list[int] | None = None
) -> bytes:
    """The records of a v2 batch, uncompressed (no headers); ``deltas_ms``: each record's
    timestamp after the batch's first (all 0 where not given)."""
    body = b""
    for i, (key, value) in enumerate(records):
        rec = b"\x00" + _varint(deltas_ms[i] if deltas_ms else 0) + _varint(i)
        for field in (key, value):
            rec += _varint(-1) if field is None else _varint(len(field)) + field
        rec += _varint(0)  # no headers
        body += _varint(len(rec)) + rec
    return body


def batch(
    records: list[tuple[bytes | None, bytes | None]],
    *,
    codec: int = 0,
    payload: bytes | None = None,
    base_offset: int = 0,
    magic: int = 2,
    producer_id: int = -1,
    attributes: int = 0,
    first_ms: int | None = None,
    deltas_ms: list[int] | None = None,
    max_ms: int | None = None,
) -> bytes:
    """One record batch of ``records`` compressed with ``codec`` (``payload``: these bytes
    instead of the compressed records), with a valid CRC. Timestamps: the batch's first
    (``first_ms``, now where not given), each record's after it (``deltas_ms``), and the
    batch's maximum (``max_ms``: what every record reads with LogAppendTime, ``attributes``
    0x08; by default the newest record's)."""
    body = (
        payload
        if payload is not None
        else compression.deflate(codec, records_body(records, deltas_ms))
    )
    now_ms = (
        int(time.time() * 1000) if first_ms is None else first_ms
    )  # a broker with time retention keeps recent records only
    top_ms = max_ms if max_ms is not None else now_ms + max(deltas_ms or [0])
    after_crc = (
        struct.pack(
            ">hiqqqhii",
            attributes | codec,
            len(records) - 1,
            now_ms,
            top_ms,
            producer_id,
            -1,
            -1,
            len(records),
        )
        + body
    )
    crc = crc32c.crc32c(after_crc)
    after_length = struct.pack(">ibI", 0, magic, crc) + after_crc
    return struct.pack(">qi", base_offset, len(after_length)) + after_length


def produce(bootstrap: str, topic: str, partition: int, raw: bytes) -> int:
    """Send ``raw`` (record batches) with Produce v3, acks=1; return the error code."""
    host, _, port = bootstrap.rpartition(":")
    conn = _Connection(host, int(port), 10)
    try:
        body = (
            _string(None)
            + struct.pack(">hi", 1, 10_000)
            + struct.pack(">i", 1)
            + _string(topic)
            + struct.pack(">ii", 1, partition)
            + struct.pack(">i", len(raw))
            + raw
        )
        r = conn.request(0, 3, body)
        r.take(">i")  # topics
        r.string()
        r.take(">i")  # partitions
        r.take(">i")
        return int(r.take(">h"))
    finally:
        conn.close()
