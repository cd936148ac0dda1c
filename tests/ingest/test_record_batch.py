"""Record batches as Kafka writes them, parsed without a broker: every codec (snappy in
both framings), the size cap, batches that cannot be read, and read_committed's filter."""

from __future__ import annotations

import struct

import cramjam
import pytest

from pipeline.ingest.kafka import compression
from pipeline.ingest.kafka.record_batch import Skipped, UnreadableBatch, parse_batches
from tests.ingest import raw_batches

RECORDS = [(f"k{i}".encode(), f"value {i} ".encode() * (i % 9)) for i in range(50)] + [
    (None, b"no key"),
    (b"k", None),
]


def _read(raw: bytes, **kwargs: object) -> list[tuple[int, bytes | None, bytes | None]]:
    found, _ = parse_batches(raw, start=0, end=1 << 40, **kwargs)  # type: ignore[arg-type]
    out = []
    for rec in found:
        for i in range(len(rec)):
            key = (
                bytes(rec.key_data[rec.key_offsets[i] : rec.key_offsets[i + 1]])
                if rec.key_valid[i]
                else None
            )
            value = (
                bytes(rec.value_data[rec.value_offsets[i] : rec.value_offsets[i + 1]])
                if rec.value_valid[i]
                else None
            )
            out.append((int(rec.offsets[i]), key, value))
    return out


@pytest.mark.parametrize("codec", list(compression.CODECS))
def test_every_codec_reads_back(codec: int) -> None:
    assert _read(raw_batches.batch(RECORDS, codec=codec)) == [
        (i, k, v) for i, (k, v) in enumerate(RECORDS)
    ]


def test_snappy_in_xerial_framing_as_the_java_client_writes_it() -> None:
    body = raw_batches.records_body(RECORDS)
    blocks = [
        bytes(cramjam.snappy.compress_raw(body[i : i + 100])) for i in range(0, len(body), 100)
    ]
    framed = (
        b"\x82SNAPPY\x00"
        + struct.pack(">ii", 1, 1)
        + b"".join(struct.pack(">i", len(b)) + b for b in blocks)
    )
    assert _read(raw_batches.batch(RECORDS, codec=2, payload=framed)) == [
        (i, k, v) for i, (k, v) in enumerate(RECORDS)
    ]


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_a_compression_bomb_stops_at_the_cap(codec: int) -> None:
    """10 MB of records in a few kilobytes: over a 1 MB cap, the batch is unreadable (not
    an out-of-memory), and its offset and the cap are named."""
    bomb = [(None, bytes(100_000))] * 100
    raw = raw_batches.batch(bomb, codec=codec, base_offset=7)
    assert len(raw) < 600_000
    with pytest.raises(
        UnreadableBatch, match="batch at offset 7 .* more than the cap of 1000000 bytes"
    ):
        _read(raw, max_batch_bytes=1_000_000)
    assert len(_read(raw, max_batch_bytes=20_000_000)) == 100


@pytest.mark.parametrize(
    ("raw", "cause"),
    [
        (
            raw_batches.batch(RECORDS, codec=4, payload=b"\x28\xb5\x2f\xfd not zstd at all"),
            "zstd batch: corrupt data",
        ),
        (raw_batches.batch(RECORDS, codec=3, payload=b"garbage"), "lz4 batch: corrupt data"),
        (
            raw_batches.batch(RECORDS, codec=2, payload=b"\x0a\xff\xff\xff"),
            "snappy batch: corrupt data",
        ),
        (
            raw_batches.batch(RECORDS, codec=1, payload=b"\x1f\x8b\x08\x00 not gzip"),
            "gzip batch: corrupt data",
        ),
        (
            raw_batches.batch(RECORDS, codec=1, payload=compression.deflate(1, bytes(1000))[:20]),
            "gzip batch: corrupt data",
        ),
        (raw_batches.batch(RECORDS, codec=5, payload=b"x"), "unknown codec 5"),
        (raw_batches.batch(RECORDS, magic=1), "record format v1"),
        (
            raw_batches.batch(RECORDS)[:-40],
            None,
        ),  # cut short by the fetch's byte limit: left for the next fetch
    ],
    ids=["zstd", "lz4", "snappy", "gzip", "gzip-cut-short", "codec-5", "v1", "partial"],
)
def test_a_batch_that_cannot_be_read_names_its_offset_and_cause(
    raw: bytes, cause: str | None
) -> None:
    if cause is None:
        assert _read(raw) == []
        return
    with pytest.raises(UnreadableBatch, match=f"batch at offset 0 cannot be read: .*{cause}"):
        _read(raw)


def test_records_that_overrun_their_batch_are_unreadable() -> None:
    body = raw_batches.records_body(RECORDS)
    raw = raw_batches.batch(
        RECORDS + [(b"x", b"y")], payload=body
    )  # one record more than the batch holds
    with pytest.raises(UnreadableBatch, match="cut short|shorter than its records"):
        _read(raw)


def _marker(offset: int, producer: int, abort: bool) -> bytes:
    return raw_batches.batch(
        [(struct.pack(">hh", 0, 0 if abort else 1), b"\x00\x00\x00\x00\x00\x00")],
        base_offset=offset,
        producer_id=producer,
        attributes=0x30,
    )


def test_read_committed_drops_aborted_transactions_and_markers() -> None:
    """Producer 7 aborts [0, 2) and commits [3, 5); producer 8 commits [2, 3) in between;
    a plain record ends the log. read_uncommitted keeps every data record."""
    txn = 0x10
    log = (
        raw_batches.batch(RECORDS[:2], base_offset=0, producer_id=7, attributes=txn)
        + raw_batches.batch(RECORDS[2:3], base_offset=2, producer_id=8, attributes=txn)
        + _marker(3, 7, abort=True)
        + _marker(4, 8, abort=False)
        + raw_batches.batch(RECORDS[3:5], base_offset=5, producer_id=7, attributes=txn)
        + _marker(7, 7, abort=False)
        + raw_batches.batch(RECORDS[5:6], base_offset=8)
    )
    skipped = Skipped()
    assert [o for o, _, _ in _read(log, aborted=[(7, 0)], skipped=skipped)] == [2, 5, 6, 8]
    assert (skipped.aborted, skipped.control, skipped.first) == (2, 3, 0)
    assert [o for o, _, _ in _read(log)] == [0, 1, 2, 5, 6, 8]


def test_a_broker_that_drops_aborted_records_itself_leaves_a_gap_that_is_counted() -> None:
    """noida leaves aborted batches out of a read_committed response: the gap before the
    next batch is counted as aborted where the response lists an aborted transaction."""
    log = _marker(5, 7, abort=True) + raw_batches.batch(RECORDS[:2], base_offset=6)
    skipped = Skipped()
    found, next_offset = parse_batches(log, start=2, end=8, aborted=[(7, 2)], skipped=skipped)
    assert [int(o) for rec in found for o in rec.offsets] == [6, 7] and next_offset == 8
    assert (skipped.aborted, skipped.control, skipped.first) == (3, 1, 2)


def _small_batches(corrupt_at: int | None = None) -> bytes:
    """Batches of three records as a producer at a low rate writes them, each with its own
    times (every fourth with LogAppendTime), the fifth compressed; ``corrupt_at``: that
    batch claims a record more than it holds."""
    log = b""
    for b in range(12):
        records = RECORDS[3 * b : 3 * b + 3]
        log += raw_batches.batch(
            records + ([(b"x", b"y")] if b == corrupt_at else []),
            payload=raw_batches.records_body(records) if b == corrupt_at else None,
            codec=4 if b == 4 else 0,
            base_offset=3 * b,
            first_ms=1_000 * b,
            deltas_ms=[0, 7, 9],
            attributes=0x08 if b % 4 == 3 else 0,
            max_ms=1_000 * b + 500 if b % 4 == 3 else None,
        )
    return log


def test_many_small_batches_are_read_as_one_set_with_each_batchs_own_offsets_and_times() -> None:
    """Proves: a response of many small batches (plain ones parsed together, a compressed
    one among them) gives one set of records, cut to the range inside its first and last
    batch, each record with its own batch's offsets and times."""
    found, next_offset = parse_batches(_small_batches(), start=2, end=34)
    assert len(found) == 1 and next_offset == 36
    rec = found[0]
    assert rec.offsets.tolist() == list(range(2, 34))
    want_ms = [
        1_000 * (o // 3) + 500 if (o // 3) % 4 == 3 else 1_000 * (o // 3) + [0, 7, 9][o % 3]
        for o in range(2, 34)
    ]
    assert rec.timestamps_ms.tolist() == want_ms
    assert [
        bytes(rec.value_data[rec.value_offsets[i] : rec.value_offsets[i + 1]])
        for i in range(len(rec))
    ] == [RECORDS[o][1] for o in range(2, 34)]


def test_a_corrupt_batch_among_small_ones_is_named_or_passed_over_alone() -> None:
    """Proves: parsed together or not, a batch that cannot be read is the one named (fail),
    or the only one passed over (skip)."""
    with pytest.raises(UnreadableBatch, match="batch at offset 21 cannot be read"):
        parse_batches(_small_batches(corrupt_at=7), start=0, end=1 << 40)
    skipped = Skipped()
    found, _ = parse_batches(
        _small_batches(corrupt_at=7), start=0, end=1 << 40, skipped=skipped, on_poison="skip"
    )
    assert [int(o) for rec in found for o in rec.offsets] == [*range(21), *range(24, 36)]
    assert [p[:2] for p in skipped.poison] == [(21, 24)]


def test_a_range_ends_where_it_ends_whatever_the_response_holds_beyond_it() -> None:
    """Proves: batches past the range are not read (the first beyond it only says where the
    range ends), so a short range at the head of a long backlog costs no more than its own
    batches, and a batch that cannot be read past the range does not stop it."""
    good = _small_batches()
    cut = 0
    for _ in range(3):  # the first three batches: offsets 0 to 8
        cut += 12 + struct.unpack_from(">i", good, cut + 8)[0]
    corrupt = bytearray(good[cut:])
    corrupt[70] ^= 0xFF  # the batch at offset 9 fails its CRC
    for tail in (bytes(corrupt), good[cut:]):
        found, next_offset = parse_batches(good[:cut] + tail, start=0, end=9)
        assert [int(o) for rec in found for o in rec.offsets] == list(range(9))
        assert next_offset == 9
    with pytest.raises(UnreadableBatch):
        parse_batches(good[:cut] + bytes(corrupt), start=0, end=1 << 40)


def test_corrupt_small_batches_are_named_and_passed_over_in_offset_order() -> None:
    """Proves: among batches parsed together, the first that cannot be read is the one
    named (fail), and those passed over are counted in offset order (skip): a record with a
    malformed varint at 0, a batch declaring more records than its bytes hold at 1."""
    malformed = bytes([24]) + b"\x00" + b"\x80" * 11  # a timestamp delta of 11+ bytes
    log = (
        raw_batches.batch([(b"k", b"v")], payload=malformed, base_offset=0)
        + raw_batches.batch([(b"k", b"v")] * 50, payload=bytes(10), base_offset=1)
        + raw_batches.batch([(b"k", b"v")], base_offset=51)
    )
    with pytest.raises(UnreadableBatch, match="batch at offset 0 "):
        parse_batches(log, start=0, end=1 << 40)
    skipped = Skipped()
    found, _ = parse_batches(log, start=0, end=1 << 40, skipped=skipped, on_poison="skip")
    assert [int(o) for rec in found for o in rec.offsets] == [51]
    assert [p[:2] for p in skipped.poison] == [(0, 0), (1, 50)]


def test_sets_are_joined_only_within_arrows_int32_offsets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Proves: parts whose records would pass the joined size limit are not joined (the
    limit is 1 GiB; 60 bytes here): the plain batches before the compressed one, it, and
    those after come back as three sets, in order, nothing lost."""
    from pipeline.ingest.kafka import record_batch

    monkeypatch.setattr(record_batch, "_MOST_JOINED", 60)
    log = _small_batches()
    found, _ = parse_batches(log, start=0, end=1 << 40)
    assert len(found) == 3
    assert [int(o) for rec in found for o in rec.offsets] == list(range(36))
