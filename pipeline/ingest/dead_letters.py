"""The dead-letter topic: records that could not be decoded, kept with why and where from.

Every dead letter carries its source topic, partition and offset in headers. A batch
that Spark replays (its commit was lost) sends its rejects again; a reader of the
dead-letter topic drops repeats by that origin. A send that fails fails the batch, so
that no rejected record is lost: the batch is not committed, and is replayed.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from pipeline.errors import BrokerError
from pipeline.ingest.offsets import PassedOver

#: (bootstrap, client properties file) -> producer, one per Python worker process.
_PRODUCERS: dict[tuple[str, str | None], Any] = {}


class Target(NamedTuple):
    """Where rejected records go: a topic of a Kafka, reached as the client file says (its
    path only: a target travels in every task's closure)."""

    bootstrap: str
    topic: str
    kafka_conf: str | None = None


def send(
    target: Target,
    records: dict[str, list[Any]],
    reasons: list[str],
    *,
    extra: list[list[tuple[str, bytes]]] | None = None,
) -> None:
    """Send rejected records, original bytes and key, with the reason and origin as headers.

    Args:
        target: the dead-letter topic and its Kafka.
        records: the rejected records' columns (``key``, ``value``, ``topic``,
            ``partition``, ``offset``), as Arrow's ``to_pydict`` gives them.
        reasons: why each was rejected (:data:`pipeline.codec.REASONS`).
        extra: more headers for each record.
    """
    from kafka.errors import KafkaError

    from pipeline.ingest.kafka import client, conf

    topic, key = target.topic, (target.bootstrap, target.kafka_conf)
    producer = _PRODUCERS.get(key)
    if producer is None:
        producer = _PRODUCERS[key] = client.producer(
            target.bootstrap,
            conf=conf.load(target.kafka_conf),
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
            delivery_timeout_ms=30_000,
            request_timeout_ms=10_000,
        )

    futures, errors = [], []
    for i, reason in enumerate(reasons):
        origin = {k: str(records[k][i]).encode() for k in ("topic", "partition", "offset")}
        headers = [("streamtrain.reason", reason.encode())] + [
            (f"streamtrain.{k}", v) for k, v in origin.items()
        ]
        headers += extra[i] if extra else []
        try:
            futures.append(
                producer.send(
                    topic, value=records["value"][i], key=records["key"][i], headers=headers
                )
            )
        except KafkaError as e:  # refused before sending (too large, no metadata in time)
            errors.append(e)
    # Before the batch commits: a record is never both untrained and out of the dead-letter topic.
    producer.flush()
    errors += [f.exception for f in futures if f.failed()]
    if errors:
        raise BrokerError(
            f"{len(errors)} of {len(reasons)} rejected records could not be set aside to {topic} "
            f"({errors[0]}); the micro-batch fails and is replayed, so none is lost."
        )


def send_poison(target: Target, batches: list[PassedOver]) -> None:
    """Set aside a note of each unreadable batch passed over (``--on-poison skip``): no value
    (its bytes could not be read), the reason ``poison``, its origin (the first offset), and
    ``streamtrain.last`` and ``streamtrain.cause`` headers."""
    records: dict[str, list[Any]] = {
        "key": [None] * len(batches),
        "value": [b""] * len(batches),
        "topic": [b.topic for b in batches],
        "partition": [b.partition for b in batches],
        "offset": [b.first for b in batches],
    }
    send(
        target,
        records,
        ["poison"] * len(batches),
        extra=[
            [("streamtrain.last", str(b.last).encode()), ("streamtrain.cause", b.cause.encode())]
            for b in batches
        ],
    )


def close() -> None:
    """Close this process's dead-letter producers (an executor keeps its own for its life;
    a test process closes them before its broker stops)."""
    while _PRODUCERS:
        _, producer = _PRODUCERS.popitem()
        producer.close(timeout=5)
