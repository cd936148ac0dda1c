"""The dead-letter topic: records that could not be decoded, kept with why and where from."""

from __future__ import annotations

from typing import Any

#: bootstrap -> producer, one per Python worker process.
_PRODUCERS: dict[str, Any] = {}


def send(bootstrap: str, topic: str, records: dict[str, list[Any]], reasons: list[str]) -> None:
    """Send rejected records, original bytes and key, with the reason and origin as headers.

    Args:
        bootstrap: Kafka ``host:port``.
        topic: the dead-letter topic.
        records: the rejected records' columns (``key``, ``value``, ``topic``,
            ``partition``, ``offset``), as Arrow's ``to_pydict`` gives them.
        reasons: why each was rejected (:data:`pipeline.codec.REASONS`).
    """
    from kafka import KafkaProducer

    producer = _PRODUCERS.get(bootstrap)
    if producer is None:
        producer = _PRODUCERS[bootstrap] = KafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                                         enable_idempotence=True, linger_ms=5)
    for i, reason in enumerate(reasons):
        origin = {k: str(records[k][i]).encode() for k in ("topic", "partition", "offset")}
        headers = [("streamtrain.reason", reason.encode())] + [(f"streamtrain.{k}", v) for k, v in origin.items()]
        producer.send(topic, value=records["value"][i], key=records["key"][i], headers=headers)
    # Before the batch commits: a record is never both untrained and out of the dead-letter topic.
    producer.flush()
