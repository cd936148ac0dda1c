"""The raw Fetch reader against the real broker: it must return exactly what kafka-python's
consumer returns for the same offsets, whatever the range, batch layout or compression."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import KafkaProducer, TopicPartition

from pipeline.errors import BrokerError
from pipeline.ingest.kafka import client
from pipeline.ingest.kafka.fetch import RangeReader, UnreadableRange
from pipeline.ingest.kafka.leaders import Leaders
from pipeline.ingest.kafka.record_batch import parse_batches
from pipeline.ingest.kafka.records import varints
from pipeline.ingest.kafka.security import PLAINTEXT
from tests.ingest import raw_batches


def _produce(bootstrap: str, topic: str, n: int, **config: object) -> None:
    client.ensure_topic(bootstrap, topic, partitions=1)
    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=2, batch_size=16 << 10, **config)
    rng = np.random.default_rng(7)
    # Recent timestamps: a broker that enforces time retention, as Kafka does (noida does;
    # Tansu does not), deletes records older than a week at its next clean-up.
    base_ms = int(time.time() * 1000) - 3_600_000
    for i in range(n):
        value = (
            None
            if i % 11 == 5
            else bytes(rng.integers(0, 256, int(rng.integers(0, 900)), dtype=np.uint8))
        )
        key = None if i % 7 == 0 and value is not None else f"k{i}".encode()
        headers = [("h", b"x")] if i % 5 == 0 else None
        p.send(topic, key=key, value=value, headers=headers, timestamp_ms=base_ms + 37 * i)
        if i % 97 == 0:
            p.flush()  # many small batches, of many sizes
    p.flush()
    p.close()


def _expected(
    bootstrap: str, topic: str, start: int, end: int
) -> list[tuple[int, bytes | None, bytes | None, int]]:
    c = client.consumer(bootstrap)
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    c.seek(tp, start)
    out: list[tuple[int, bytes | None, bytes | None, int]] = []
    deadline = time.monotonic() + 30
    while (not out or out[-1][0] < end - 1) and time.monotonic() < deadline:
        for r in c.poll(timeout_ms=200).get(tp, []):
            if start <= r.offset < end:
                out.append((r.offset, r.key, r.value, r.timestamp))
    c.close()
    return out


def _read(
    reader: RangeReader, topic: str, start: int, end: int
) -> list[tuple[int, bytes | None, bytes | None, int]]:
    out = []
    for rec in reader.read(topic, 0, start, end):
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
            out.append((int(rec.offsets[i]), key, value, int(rec.timestamps_ms[i])))
    return out


N = 1500


@pytest.fixture(scope="module")
def topics(broker) -> dict[str, str]:  # type: ignore[no-untyped-def]
    made = {}
    for codec in (None, "gzip"):
        name = f"t-fetch-{codec or 'plain'}-{time.monotonic_ns()}"
        _produce(broker.bootstrap, name, N, compression_type=codec)
        made[codec or "plain"] = name
    return made


@pytest.fixture(scope="module")
def reader(broker) -> RangeReader:  # type: ignore[no-untyped-def]
    r = RangeReader(broker.bootstrap, timeout_s=5)
    yield r  # type: ignore[misc]
    r.close()


@pytest.mark.parametrize("codec", ["plain", "gzip"])
def test_whole_log_equals_the_consumers_view(broker, topics, reader, codec) -> None:  # type: ignore[no-untyped-def]
    got = _read(reader, topics[codec], 0, N)
    assert [g[0] for g in got] == list(range(N))
    assert got == _expected(broker.bootstrap, topics[codec], 0, N)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
@pytest.mark.slow  # every range of a topic, read twice: the quick tier's budget
def test_any_range_equals_the_consumers_view(broker, topics, reader, data) -> None:  # type: ignore[no-untyped-def]
    start = data.draw(st.integers(0, N - 1))
    end = data.draw(st.integers(start + 1, N))
    codec = data.draw(st.sampled_from(["plain", "gzip"]))
    got = _read(reader, topics[codec], start, end)
    assert [g[0] for g in got] == list(range(start, end))
    assert got == _expected(broker.bootstrap, topics[codec], start, end)


@pytest.mark.slow  # 3 to 8 s (a process to start or a timeout to wait out): full tier only
def test_a_range_beyond_the_log_end_times_out_clearly(topics, reader) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(
        BrokerError, match=rf"returned nothing for {topics['plain']}-0 at offset {N}"
    ):
        list(reader.read(topics["plain"], 0, N - 10, N + 5))


def test_an_unknown_topic_is_a_clear_error(broker) -> None:  # type: ignore[no-untyped-def]
    r = RangeReader(broker.bootstrap, timeout_s=2)
    with pytest.raises(BrokerError):
        list(r.read("no-such-topic-here", 0, 0, 1))
    r.close()


def test_a_corrupt_batch_fails_its_crc(broker, topics, reader) -> None:  # type: ignore[no-untyped-def]
    records = reader._fetch(topics["plain"], 0, 0, 1 << 20).records
    assert records is not None
    raw = bytearray(records)
    raw[100] ^= 0xFF  # a byte inside the first batch's records
    with pytest.raises(BrokerError, match="failed its CRC check"):
        parse_batches(bytes(raw), start=0, end=N)


@given(st.lists(st.integers(-(2**62), 2**62), min_size=1, max_size=50))
def test_varints_round_trip(values: list[int]) -> None:
    raw = b""
    positions = []
    for v in values:
        positions.append(len(raw))
        z = (v << 1) ^ (v >> 63)
        while True:
            b = z & 0x7F
            z >>= 7
            raw += bytes([b | (0x80 if z else 0)])
            if not z:
                break
    buf = np.frombuffer(raw + bytes(16), np.uint8)
    decoded, sizes = varints(buf, np.array(positions))
    assert decoded.tolist() == values
    assert int(sizes.sum()) == len(raw)


def test_leaders_of_every_partition_of_a_long_named_topic(broker) -> None:  # type: ignore[no-untyped-def]
    topic = "t-" + "long-name-" * 12 + str(time.monotonic_ns())
    client.ensure_topic(broker.bootstrap, topic, partitions=3)
    leaders = Leaders(broker.bootstrap, timeout_s=5, conf=PLAINTEXT)
    leaders._refresh(topic)
    host, port = broker.bootstrap.rsplit(":", 1)
    assert {k: v for k, v in leaders._leaders.items() if k[0] == topic} == {
        (topic, p): (host, int(port)) for p in range(3)
    }
    leaders.close()


def test_an_unreachable_broker_is_retried_until_the_timeout() -> None:
    from tests.conftest import free_port

    r = RangeReader(f"127.0.0.1:{free_port()}", timeout_s=1.5)
    started = time.monotonic()
    with pytest.raises(BrokerError, match="Cannot reach Kafka at 127.0.0.1"):
        list(r.read("t", 0, 0, 10))
    assert 1.5 <= time.monotonic() - started < 10


def _unreadable_topic(bootstrap: str, topic: str) -> None:
    """Three readable records, then a zstd batch of three whose payload is not zstd (its CRC
    valid: a broker stores it as it is)."""
    client.ensure_topic(bootstrap, topic, partitions=1)
    assert (
        raw_batches.produce(bootstrap, topic, 0, raw_batches.batch([(b"k", b"v")] * 3, codec=1))
        == 0
    )
    bad = raw_batches.batch([(b"k", b"v")] * 3, codec=4, payload=b"\x28\xb5\x2f\xfd not zstd")
    assert raw_batches.produce(bootstrap, topic, 0, bad) == 0


def test_apache_kafka_refuses_a_batch_it_cannot_read(broker, topic) -> None:  # type: ignore[no-untyped-def]
    """Why the unreadable-batch tests write to ``raw_broker``: the real broker inflates each
    batch it is given and refuses a corrupt one, so only a broker of another make (or a
    damaged disk) can serve one."""
    client.ensure_topic(broker.bootstrap, topic, partitions=1)
    bad = raw_batches.batch([(b"k", b"v")] * 3, codec=4, payload=b"\x28\xb5\x2f\xfd not zstd")
    assert raw_batches.produce(broker.bootstrap, topic, 0, bad) != 0


def test_an_unreadable_batch_names_topic_partition_offset_and_cause(raw_broker, topic) -> None:  # type: ignore[no-untyped-def]
    """Never retried and never 'returned nothing': one error at once; the records before it
    read, and the log's end is still known (the planner and lag do not decode records)."""
    broker = raw_broker
    _unreadable_topic(broker.bootstrap, topic)
    r = RangeReader(broker.bootstrap, timeout_s=30)
    assert sum(len(rec) for rec in r.read(topic, 0, 0, 3)) == 3
    started = time.monotonic()
    with pytest.raises(
        UnreadableRange,
        match=rf"Cannot read {topic}-0 at offset 3: Cannot inflate a zstd batch: "
        "corrupt data",
    ) as e:
        list(r.read(topic, 0, 0, 6))
    assert time.monotonic() - started < 5 and (
        e.value.topic,
        e.value.partition,
        e.value.offset,
    ) == (topic, 0, 3)
    r.close()
    c = client.consumer(broker.bootstrap)
    assert client.end_offsets(c, [TopicPartition(topic, 0)]) == {TopicPartition(topic, 0): 6}
    c.close()


def test_the_consumer_fallback_names_an_unreadable_batch_too(raw_broker, topic) -> None:  # type: ignore[no-untyped-def]
    from pipeline.ingest import reader
    from pipeline.ingest.offsets import OffsetRange

    broker = raw_broker
    _unreadable_topic(broker.bootstrap, topic)
    with pytest.raises(UnreadableRange, match=rf"Cannot read {topic}-0 at offset 3: ZstdError"):
        list(
            reader._read_with_consumer(broker.bootstrap, OffsetRange(topic, 0, 0, 6), timeout_s=10)
        )


def test_a_broker_that_sends_more_than_asked_is_cut_and_read_on() -> None:
    """Proves: noida-db answers a Fetch with the log from the offset to its end, whatever
    its byte limits; the reader keeps what it asked for, reconnects, and reads the range
    exactly, where it used to fail on the first response past its bound (a backlog of
    ~330,000 MNIST records in a partition stopped a run)."""
    from pipeline.ingest.kafka.broker import EmbeddedBroker

    with EmbeddedBroker(engine="noida") as b:
        _produce(b.bootstrap, "long", 6_000)  # ~2.7 MB of records
        expected = _expected(b.bootstrap, "long", 100, 5_900)
        # Asks for 64 KiB at a time: each response is cut at 1 MiB past it, far short of the log.
        reader = RangeReader(b.bootstrap, max_partition_bytes=64 << 10, max_batch_bytes=1 << 20)
        try:
            got = _read(reader, "long", 100, 5_900)
        finally:
            reader.close()
    assert got == expected and len(got) == 5_800


def test_close_consumers_ends_the_fallbacks_background_connections(broker, topic) -> None:  # type: ignore[no-untyped-def]
    """The consumer fallback keeps a consumer per broker for its process; left open after its
    broker stops, its network thread goes on reconnecting to that port (a Spark worker's
    connect-back socket got such a consumer's TLS hello and failed a query). Closing the
    cache ends that thread."""
    import threading

    from pipeline.ingest import reader
    from pipeline.ingest.offsets import OffsetRange

    def network_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("kafka-io")}

    _produce(broker.bootstrap, topic, 5)
    before = network_threads()
    got = reader._read_with_consumer(broker.bootstrap, OffsetRange(topic, 0, 0, 5), timeout_s=10)
    assert sum(b.num_rows for b in got) == 5
    started = network_threads() - before
    assert started, "the fallback's consumer runs no network thread to end"
    reader.close_consumers()
    deadline = time.monotonic() + 10
    while any(t.is_alive() for t in started):  # bounded: 10 s
        assert time.monotonic() < deadline, "the consumer's network thread outlived its close"
        time.sleep(0.05)


def test_records_deleted_below_the_log_start_are_one_error_and_the_rest_reads(
    broker, topic
) -> None:  # type: ignore[no-untyped-def]
    """Proves, on Apache Kafka: once records are deleted (DeleteRecords, as retention does),
    a read from below the new log start is one OffsetOutOfRange naming the partition and
    the cause, never a silent gap, and a read from the log start on gets every record."""
    from pipeline.ingest.kafka.fetch import OffsetOutOfRange

    client.ensure_topic(broker.bootstrap, topic, partitions=1)
    p = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i in range(20):
        p.send(topic, b"v%d" % i, partition=0)
    p.flush()
    p.close()
    admin = client.admin(broker.bootstrap)
    try:
        admin.delete_records({TopicPartition(topic, 0): 10})
    finally:
        admin.close()
    r = RangeReader(broker.bootstrap, timeout_s=30)
    try:
        with pytest.raises(OffsetOutOfRange, match=rf"Offset 0 of {topic}-0 is out of range"):
            list(r.read(topic, 0, 0, 20))
        offsets = [int(o) for records in r.read(topic, 0, 10, 20) for o in records.offsets]
    finally:
        r.close()
    assert offsets == list(range(10, 20))
