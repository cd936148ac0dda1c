"""Releasing trained records: Apache Kafka and noida delete them (noida gives the memory
back); Tansu cannot, and says so once without failing anything."""

from __future__ import annotations

import logging
import time

import pytest
from kafka import KafkaProducer, TopicPartition

from pipeline.ingest.kafka import EmbeddedBroker, client
from pipeline.ingest.kafka.release import Releaser
from pipeline.ingest.offsets import OffsetRange

RECORD = b"x" * 1000


def _fill(bootstrap: str, topic: str, n: int) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, batch_size=1 << 20)
    for i in range(n):
        producer.send(topic, RECORD, partition=i % 2)
    producer.flush()
    producer.close()


def _rss_mb(pid: int) -> int:
    return int(open(f"/proc/{pid}/status").read().split("VmRSS:")[1].split()[0]) // 1024


def _earliest(bootstrap: str, topic: str) -> dict[int, int]:
    c = client.consumer(bootstrap)
    try:
        found = c.beginning_offsets([TopicPartition(topic, p) for p in (0, 1)])
    finally:
        c.close()
    return {tp.partition: offset for tp, offset in found.items()}


def _releases_each_batch_once_the_next_is_saved(bootstrap: str, topic: str) -> None:
    client.ensure_topic(bootstrap, topic, partitions=2)
    _fill(bootstrap, topic, 100)
    releaser = Releaser(bootstrap, topic)
    try:
        releaser.trained([OffsetRange(topic, p, 0, 25) for p in (0, 1)])
        assert releaser.flush()
        assert _earliest(bootstrap, topic) == {0: 0, 1: 0}  # batch 0 may be replayed yet
        releaser.trained([OffsetRange(topic, p, 25, 50) for p in (0, 1)])  # Spark committed 0
        assert releaser.flush()
        assert _earliest(bootstrap, topic) == {0: 25, 1: 25}
        assert releaser.released == {0: 25, 1: 25}
    finally:
        releaser.close()


def test_noida_releases_each_batch_once_the_next_is_saved() -> None:
    with EmbeddedBroker(engine="noida") as broker:
        _releases_each_batch_once_the_next_is_saved(broker.bootstrap, "replayed")


def test_apache_kafka_releases_each_batch_once_the_next_is_saved(
    broker: EmbeddedBroker, topic: str
) -> None:
    _releases_each_batch_once_the_next_is_saved(broker.bootstrap, topic)


@pytest.mark.slow  # 3 to 8 s (a process to start or a timeout to wait out): full tier only
def test_with_trained_records_released_noidas_memory_stops_growing_with_the_replay() -> None:
    """Four rounds of 60 MB each, every record trained: without the releases the broker holds
    all 240 MB (measured: 430 MB over its empty self); with them a round's worth or two
    (measured: 100-120 MB, on an idle and on a loaded machine; 184 MB once in a full suite)."""
    per_round = 60_000
    with EmbeddedBroker(engine="noida") as broker:
        client.ensure_topic(broker.bootstrap, "replayed", partitions=2)
        empty = _rss_mb(broker.pid)
        releaser = Releaser(broker.bootstrap, "replayed")
        grown = []
        try:
            for n in range(4):
                _fill(broker.bootstrap, "replayed", per_round)
                half = (n + 1) * per_round // 2
                releaser.trained(
                    [OffsetRange("replayed", p, half - per_round // 2, half) for p in (0, 1)]
                )
                releaser.trained([OffsetRange("replayed", p, half, half) for p in (0, 1)])
                assert releaser.flush()
                grown.append(_rss_mb(broker.pid))
        finally:
            releaser.close()
        assert _earliest(broker.bootstrap, "replayed") == {0: 2 * per_round, 1: 2 * per_round}
        # It frees in its own time, and how much the allocator keeps depends on the machine's
        # load (a first round's figure is no baseline: 57 MB idle, 142 MB loaded; one full-suite
        # run kept 184 MB over the empty broker a minute on). The bound is against the data:
        # under the four rounds' 240 MB over the empty broker, which holds 430 MB without the
        # releases.
        deadline = time.monotonic() + 60
        while _rss_mb(broker.pid) - empty >= 4 * 60:
            assert time.monotonic() < deadline, (
                f"the broker's memory: {empty} MB empty, {grown} MB after each round, "
                f"{_rss_mb(broker.pid)} MB a minute on"
            )
            time.sleep(0.5)


def test_tansu_cannot_release_and_the_run_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    with EmbeddedBroker(engine="tansu") as broker:
        client.ensure_topic(broker.bootstrap, "kept", partitions=2)
        _fill(broker.bootstrap, "kept", 100)
        releaser = Releaser(broker.bootstrap, "kept")
        try:
            with caplog.at_level(logging.INFO, logger="pipeline.ingest.kafka.release"):
                for start in (0, 25, 50):
                    releaser.trained([OffsetRange("kept", p, start, start + 25) for p in (0, 1)])
                    assert releaser.flush()
            assert not releaser.supported
            assert [r.message for r in caplog.records if "keeps the records" in r.message][:1]
            assert len([r for r in caplog.records if "keeps the records" in r.message]) == 1
            assert _earliest(broker.bootstrap, "kept") == {0: 0, 1: 0}
        finally:
            releaser.close()


def test_only_the_runs_topic_is_released(broker: EmbeddedBroker, topic: str) -> None:
    """On the session's Apache Kafka: DeleteRecords on the run's topic, never its dead letters."""
    letters = f"{topic}.dlq"
    for name in (topic, letters):
        client.ensure_topic(broker.bootstrap, name, partitions=2)
        _fill(broker.bootstrap, name, 100)
    releaser = Releaser(broker.bootstrap, topic)
    try:
        for start in (0, 25):
            releaser.trained(
                [OffsetRange(t, p, start, start + 25) for t in (topic, letters) for p in (0, 1)]
            )
        assert releaser.flush()
        assert _earliest(broker.bootstrap, topic) == {0: 25, 1: 25}
        assert _earliest(broker.bootstrap, letters) == {0: 0, 1: 0}
    finally:
        releaser.close()
