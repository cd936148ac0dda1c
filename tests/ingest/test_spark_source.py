"""streamtrain's Python source on the driver: the offsets each trigger plans, read through one
consumer kept for the query's life (it cost each trigger a connection's set-up before)."""

from __future__ import annotations

import pickle

from kafka.admin import NewPartitions
from pyspark.sql.datasource import CaseInsensitiveDict

from pipeline.ingest import spark_source
from pipeline.ingest.kafka import EmbeddedBroker, client


def _send(bootstrap: str, topic: str, partition: int, n: int) -> None:
    producer = client.producer(bootstrap)
    try:
        for i in range(n):
            producer.send(topic, f"r{i}".encode(), partition=partition)
        producer.flush()
    finally:
        producer.close()


def test_each_trigger_reuses_the_drivers_consumer_and_sees_a_partition_added(
    broker: EmbeddedBroker, topic: str
) -> None:
    """Proves: the reader plans every trigger through one consumer, which fetches the
    cluster's metadata each time, so a partition added between triggers is planned from its
    beginning; the consumer never travels with the reader into a task, and stopping the query
    closes it (the next trigger would connect anew)."""
    client.ensure_topic(broker.bootstrap, topic, partitions=1)
    _send(broker.bootstrap, topic, 0, 3)
    reader = spark_source.KafkaStreamReader(
        CaseInsensitiveDict({"kafka.bootstrap.servers": broker.bootstrap, "subscribe": topic})
    )
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        kept = reader._consumer
        assert start == {topic: {"0": 0}} and end == {topic: {"0": 3}} and kept is not None
        admin = client.admin(broker.bootstrap)
        try:
            admin.create_partitions({topic: NewPartitions(total_count=2)})
        finally:
            admin.close()
        _send(broker.bootstrap, topic, 1, 2)
        later = reader.latestOffset(end, reader.getDefaultReadLimit())
        assert later == {topic: {"0": 3, "1": 2}} and reader._consumer is kept
        assert [(r.partition, r.start, r.end) for r in reader.partitions(end, later)] == [(1, 0, 2)]
        assert pickle.loads(pickle.dumps(reader))._consumer is None
    finally:
        reader.stop()
    assert reader._consumer is None
