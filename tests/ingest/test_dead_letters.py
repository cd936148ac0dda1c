"""The dead-letter topic against the real broker: origin kept, and no reject lost silently."""

from __future__ import annotations

import pytest

from pipeline.errors import BrokerError
from pipeline.ingest import dead_letters
from pipeline.ingest.kafka import client


@pytest.fixture(autouse=True, scope="module")
def _close_producers():  # type: ignore[no-untyped-def]
    yield
    dead_letters.close()  # before the session's broker stops, so none retries it at exit


def _rejects(values: list[bytes]) -> dict[str, list[object]]:
    return {
        "key": [b"k%d" % i for i in range(len(values))],
        "value": values,
        "topic": ["in"] * len(values),
        "partition": [1] * len(values),
        "offset": list(range(40, 40 + len(values))),
    }


def test_rejects_keep_their_origin_for_readers_to_drop_repeats(broker, topic, consume) -> None:  # type: ignore[no-untyped-def]
    client.ensure_topic(broker.bootstrap, topic, partitions=1)
    dead_letters.send(
        dead_letters.Target(broker.bootstrap, topic),
        _rejects([b"x", b"y"]),
        ["wrong_length", "wrong_schema"],
    )
    got = consume(topic, 2)
    assert [dict(r.headers)["streamtrain.offset"] for r in got] == [b"40", b"41"]
    assert [dict(r.headers)["streamtrain.reason"] for r in got] == [
        b"wrong_length",
        b"wrong_schema",
    ]


def test_a_reject_that_cannot_be_sent_fails_the_batch(broker, topic) -> None:  # type: ignore[no-untyped-def]
    """Proves: a dead letter Kafka does not take (here, over the producer's request size)
    raises, so the micro-batch is not committed and its rejects are not lost silently."""
    client.ensure_topic(broker.bootstrap, topic, partitions=1)
    with pytest.raises(BrokerError, match=r"1 of 2 rejected records could not be set aside"):
        dead_letters.send(
            dead_letters.Target(broker.bootstrap, topic),
            _rejects([b"small", b"x" * (2 << 20)]),
            ["wrong_length", "wrong_length"],
        )
