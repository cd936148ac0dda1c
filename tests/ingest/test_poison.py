"""Poison from Kafka: a peer that answers with absurd frame sizes or garbage, and batches
whose headers claim more than their bytes hold. Each is one error naming topic, partition
and offset, and no allocation follows what the bytes say."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from pipeline.errors import BrokerError
from pipeline.ingest.kafka.fetch import RangeReader
from pipeline.ingest.kafka.record_batch import UnreadableBatch, parse_batches
from pipeline.ingest.kafka.wire import string as _string
from tests.ingest import raw_batches

TOPIC = "poison"


def _metadata(port: int) -> bytes:
    """A Metadata v4 response: this peer leads partition 0 of TOPIC."""
    return (
        struct.pack(">i", 0)
        + struct.pack(">i", 1)
        + struct.pack(">i", 1)
        + _string("127.0.0.1")
        + struct.pack(">i", port)
        + _string(None)
        + _string(None)
        + struct.pack(">i", 1)
        + struct.pack(">i", 1)
        + struct.pack(">h", 0)
        + _string(TOPIC)
        + b"\x00"
        + struct.pack(">i", 1)
        + struct.pack(">hii", 0, 0, 1)
        + struct.pack(">ii", 0, 0)
    )


@contextlib.contextmanager
def _peer(fetch_reply: bytes) -> Iterator[int]:
    """A loopback peer that answers Metadata as a Kafka broker and every Fetch with
    ``fetch_reply`` (its frame length and all, the correlation id patched in after the length
    where the reply is long enough to hold one)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while not stop.is_set():
                head = conn.recv(4, socket.MSG_WAITALL)
                if len(head) < 4:
                    return
                request = conn.recv(struct.unpack(">i", head)[0], socket.MSG_WAITALL)
                api, correlation = struct.unpack_from(">h", request)[0], request[4:8]
                if api == 3:
                    body = correlation + _metadata(port)
                    conn.sendall(struct.pack(">i", len(body)) + body)
                else:
                    reply = (
                        fetch_reply[:4] + correlation + fetch_reply[8:]
                        if len(fetch_reply) >= 8
                        else fetch_reply
                    )
                    conn.sendall(reply)

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield port
    finally:
        stop.set()
        t.join(5)
        listener.close()


@pytest.mark.parametrize(
    "reply, message",
    [
        (struct.pack(">i", -1), "declares -1 bytes"),
        (struct.pack(">i", 0x7FFFFFFF), "declares 2147483647 bytes"),
        # A topic name longer than the response, then fields past its end.
        (
            struct.pack(">i", 22) + bytes(4) + struct.pack(">ihiih", 0, 0, 0, 1, 30000) + b"x" * 2,
            "Fetch response for poison-0 at offset 5 is malformed",
        ),
    ],
    ids=["negative", "2GiB", "garbage"],
)
def test_a_peer_that_is_not_kafka_is_one_error_and_no_allocation(
    reply: bytes, message: str
) -> None:
    """Proves: a response frame declaring a negative size or 2 GiB, and a Fetch response of
    garbage, are one BrokerError naming what is wrong (the partition and offset where it
    applies): no ValueError, no 2 GiB buffer."""
    with _peer(reply) as port:
        reader = RangeReader(f"127.0.0.1:{port}", timeout_s=2)
        try:
            with pytest.raises(BrokerError, match=message):
                list(reader.read(TOPIC, 0, 5, 10))
        finally:
            reader.close()


def test_a_batch_header_that_claims_more_records_than_its_bytes_hold_is_unreadable() -> None:
    """Proves: a batch (valid CRC) whose header says 100 million records in a few bytes is
    unreadable at its offset before any array is sized by that count."""
    raw = bytearray(raw_batches.batch([(b"k", b"v")], base_offset=3))
    struct.pack_into(">i", raw, 57, 100_000_000)  # the record count, inside the CRC's span
    import crc32c

    struct.pack_into(">I", raw, 17, crc32c.crc32c(bytes(raw[21:])))
    with pytest.raises(
        UnreadableBatch, match="batch at offset 3 .* declares 100,000,000 records in"
    ):
        parse_batches(bytes(raw), start=0, end=1 << 40)


def _log_with_poison() -> bytes:
    """Offsets 0-1 readable, 2-4 a zstd batch whose payload is not zstd (CRC valid), 5-6
    readable."""
    return (
        raw_batches.batch([(b"k", b"a")] * 2, base_offset=0)
        + raw_batches.batch(
            [(b"k", b"b")] * 3, codec=4, payload=b"\x28\xb5\x2f\xfd not zstd", base_offset=2
        )
        + raw_batches.batch([(b"k", b"c")] * 2, base_offset=5)
    )


def test_skip_passes_over_an_unreadable_batch_and_counts_its_offsets_and_cause() -> None:
    """Proves: with on_poison="skip" the records around an unreadable batch are read, the
    batch's offsets and cause are counted, and the offset to fetch next is past it; "fail"
    (the default) still stops at it."""
    from pipeline.ingest.kafka.record_batch import Skipped

    skipped = Skipped()
    found, next_offset = parse_batches(
        _log_with_poison(), start=1, end=7, skipped=skipped, on_poison="skip"
    )
    assert [int(o) for rec in found for o in rec.offsets] == [1, 5, 6] and next_offset == 7
    assert skipped.poisoned == 3 and [p[:2] for p in skipped.poison] == [(2, 4)]
    assert "zstd batch: corrupt data" in skipped.poison[0][2]
    with pytest.raises(UnreadableBatch, match="batch at offset 2"):
        parse_batches(_log_with_poison(), start=0, end=7)


@pytest.mark.slow  # a Spark session: the quick tier's budget
def test_a_stream_with_on_poison_skip_goes_on_and_sets_the_batch_aside(
    spark,
    raw_broker,
    topic,
    tmp_path,  # type: ignore[no-untyped-def]
    consume,
) -> None:
    """Proves: a real stream (Spark, the embedded broker) over a partition holding an
    unreadable batch goes on with --on-poison skip: the records around it are handled,
    the batch's figures carry its offsets and cause, and the dead-letter topic gets one
    note of it (reason poison, its first and last offset), before the batch commits."""
    from pipeline.ingest import dead_letters
    from pipeline.ingest.kafka import client
    from pipeline.ingest.offsets import PassedOver
    from tests.ingest.test_stream import _job

    broker = raw_broker  # Apache Kafka refuses a corrupt batch (test_fetch)
    client.ensure_topic(broker.bootstrap, topic, partitions=1)
    assert raw_batches.produce(broker.bootstrap, topic, 0, _log_with_poison()) == 0
    job = _job(spark, broker, topic, tmp_path / "ckpt", available_now=True, on_poison="skip")
    try:
        job.run(timeout_s=120)
    finally:
        dead_letters.close()
    assert sum(b.rows for b in job.batches) == 4
    [passed] = [p for b in job.batches for p in b.poison]
    assert (passed.topic, passed.partition, passed.first, passed.last) == (topic, 0, 2, 4)
    assert isinstance(passed, PassedOver) and "zstd batch: corrupt data" in passed.cause
    assert sum(b.poisoned for b in job.batches) == 3
    letters = consume(f"{topic}.dlq", 5, bootstrap=broker.bootstrap)
    notes = [
        dict(r.headers) for r in letters if dict(r.headers).get("streamtrain.reason") == b"poison"
    ]
    assert [(n["streamtrain.offset"], n["streamtrain.last"]) for n in notes] == [(b"2", b"4")], (
        letters
    )


def test_a_passed_over_batch_reaches_the_row_the_report_and_prometheus() -> None:
    """Proves: a batch's passed-over batches go to its row (and batches.jsonl), the run's
    history (report.json's "poison"), and streamtrain_stream_records_poisoned_total."""
    from pipeline.ingest.batch_figures import BatchFigures
    from pipeline.ingest.offsets import OffsetRange, PassedOver
    from pipeline.jobs.report import History
    from pipeline.jobs.run_metrics import RunMetrics
    from pipeline.train.rows import BatchRow

    passed = PassedOver(TOPIC, 0, 2, 4, "Cannot inflate a zstd batch: corrupt data")
    info = BatchFigures(7, [OffsetRange(TOPIC, 0, 0, 7)], rows=4, poisoned=3, poison=[passed])
    row = BatchRow.from_batch(info, t=1.0, clock=3)
    assert row.poison == [passed] and row.to_dict()["poison"] == [dataclasses.asdict(passed)]
    history = History()
    history.add(row, ended_at=1.0)
    assert history.poison == [passed]
    run = RunMetrics(dataset="mnist", algorithm="sync", topic=TOPIC, workers=1)
    run.on_batch(info, row)
    assert (
        run.meters.registry.get_sample_value(
            "streamtrain_stream_records_poisoned_total", {"topic": TOPIC}
        )
        == 3
    )
