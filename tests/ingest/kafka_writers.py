"""Records written as Kafka producers in the wild write them: kafka-python, confluent-kafka
(librdkafka 2.16) and kcat (Debian's, librdkafka 2.0), each with any codec, idempotent or
in transactions that commit, abort or stay open.

A :class:`Script` is what one producer writes to partition 0 of a topic, step by step,
and what a reader must then see: the committed records (read_committed), everything
(read_uncommitted), the aborted records, and where the open transaction begins.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
PRODUCERS = ("kafka-python", "confluent-kafka", "kcat")
#: The steps of a script: records sent outside a transaction (idempotent), and transactions.
STEPS = ("idempotent", "commit", "abort", "open")
#: kcat commits one transaction per run and aborts only on errors: it cannot abort on purpose
#: or leave a transaction open.
CAN = {"kafka-python": set(STEPS), "confluent-kafka": set(STEPS), "kcat": {"idempotent", "commit"}}


@dataclasses.dataclass
class Script:
    """What was written, in log order, and where the open transaction starts (None: none)."""

    steps: list[tuple[str, list[tuple[bytes, bytes]]]] = dataclasses.field(default_factory=list)
    open_at: int | None = None
    finish: list[Callable[[], None]] = dataclasses.field(
        default_factory=list
    )  # aborts what is still open

    def values(self, *kinds: str) -> list[bytes]:
        return [v for kind, records in self.steps if kind in kinds for _, v in records]

    @property
    def committed(self) -> list[bytes]:
        return self.values("idempotent", "commit")

    def close(self) -> None:
        for f in self.finish:
            f()
        self.finish.clear()


#: A producer the broker fenced: kafka-python's errors, librdkafka's codes.
FENCED = frozenset(
    {
        "ProducerFencedError",
        "InvalidProducerEpochError",
        "_FENCED",
        "PRODUCER_FENCED",
        "INVALID_PRODUCER_EPOCH",
    }
)


def _abort_left_open(writer: Any) -> None:
    """Abort a transaction left open for the read_committed tests, and close its producer. A
    broker aborts a transaction itself once it outlives its timeout, and fences the producer
    (Tansu has, in a long module): that is the transaction's end as well, not a failure."""
    for step in (lambda: writer.end(False), writer.close):  # a fenced librdkafka's flush too
        try:
            step()
        except Exception as err:
            # kafka-python raises these by name; confluent-kafka a KafkaException with the code.
            code = err.args[0].name() if err.args and hasattr(err.args[0], "name") else ""
            if type(err).__name__ not in FENCED and code not in FENCED:
                raise


def payloads(label: str, n: int) -> list[tuple[bytes, bytes]]:
    """``n`` records whose value names the step they belong to (text with no newline or
    colon, so that kcat's delimiters can carry it)."""
    return [
        (f"{label}-k{i}".encode(), f"{label}-v{i}-".encode() + b"x" * (40 + 7 * i))
        for i in range(n)
    ]


# --- one writer per client: send(records) outside a transaction, or begin/send/end one ---


class _KafkaPython:
    def __init__(self, bootstrap: str, codec: str, transactional: bool) -> None:
        from kafka import KafkaProducer

        config: dict[str, Any] = {
            "bootstrap_servers": bootstrap,
            "enable_idempotence": True,
            "linger_ms": 5,
            "compression_type": None if codec == "none" else codec,
        }
        if transactional:
            config["transactional_id"] = f"kp-{uuid.uuid4().hex[:8]}"
        self.p = KafkaProducer(**config)
        if transactional:
            self.p.init_transactions()

    def send(self, topic: str, records: list[tuple[bytes, bytes]]) -> None:
        for key, value in records:
            self.p.send(topic, key=key, value=value, partition=0)
        self.p.flush(30)

    def begin(self) -> None:
        self.p.begin_transaction()

    def end(self, commit: bool) -> None:
        (self.p.commit_transaction if commit else self.p.abort_transaction)()

    def close(self) -> None:
        self.p.close(timeout=10)


class _Confluent:
    def __init__(self, bootstrap: str, codec: str, transactional: bool) -> None:
        from confluent_kafka import Producer

        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "compression.type": codec,
        }
        if transactional:
            config["transactional.id"] = f"ck-{uuid.uuid4().hex[:8]}"
        self.p = Producer(config)
        if transactional:
            self.p.init_transactions(30)
        self.errors: list[object] = []

    def send(self, topic: str, records: list[tuple[bytes, bytes]]) -> None:
        for key, value in records:
            self.p.produce(
                topic,
                value=value,
                key=key,
                partition=0,
                on_delivery=lambda err, _m: err and self.errors.append(err),
            )
        assert self.p.flush(30) == 0, "confluent-kafka could not deliver every record within 30 s"
        assert not self.errors, self.errors[:3]

    def begin(self) -> None:
        self.p.begin_transaction()

    def end(self, commit: bool) -> None:
        (self.p.commit_transaction if commit else self.p.abort_transaction)(30)

    def close(self) -> None:
        self.p.flush(10)


def _kcat_send(
    bootstrap: str, topic: str, codec: str, records: list[tuple[bytes, bytes]], *extra: str
) -> None:
    # Delimiters that no record holds, so that binary keys and values pass through kcat.
    key_end, record_end = (
        b"|k-" + uuid.uuid4().hex.encode() + b"|",
        b"|r-" + uuid.uuid4().hex.encode() + b"|",
    )
    assert not any(key_end in k + v or record_end in k + v for k, v in records)
    lines = b"".join(k + key_end + v + record_end for k, v in records)
    out = subprocess.run(
        [
            "kcat",
            "-b",
            bootstrap,
            "-P",
            "-t",
            topic,
            "-p",
            "0",
            "-K",
            key_end.decode(),
            "-D",
            record_end.decode(),
            "-X",
            f"compression.codec={codec}",
            "-X",
            "enable.idempotence=true",
            *extra,
        ],
        input=lines,
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr.decode()[-800:]


WRITERS: dict[str, Callable[[str, str, bool], Any]] = {
    "kafka-python": _KafkaPython,
    "confluent-kafka": _Confluent,
}


def write_step(
    script: Script,
    producer: str,
    bootstrap: str,
    topic: str,
    codec: str,
    step: str,
    records: list[tuple[bytes, bytes]],
) -> None:
    """Write one step (from :data:`STEPS`) of ``records`` to partition 0 of ``topic`` with
    ``producer`` and ``codec``, and add it to ``script``."""
    # Apache Kafka writes a transaction's marker after EndTxn has answered: wait for the
    # markers of the steps before, or an open transaction's first offset is read one short.
    offset = _log_end(bootstrap, topic)
    deadline = time.monotonic() + 20
    while offset < offsets_written(script) and time.monotonic() < deadline:
        time.sleep(0.02)
        offset = _log_end(bootstrap, topic)
    if producer == "kcat":
        assert step in CAN["kcat"], f"kcat cannot write a transaction that {step}s"
        extra = ["-X", f"transactional.id=kc-{uuid.uuid4().hex[:8]}"] if step == "commit" else []
        _kcat_send(bootstrap, topic, codec, records, *extra)
    elif step == "idempotent":
        w = WRITERS[producer](bootstrap, codec, False)
        w.send(topic, records)
        w.close()
    else:
        w = WRITERS[producer](bootstrap, codec, True)
        w.begin()
        w.send(topic, records)
        if step == "open":
            script.open_at = offset
            script.finish.append(lambda: _abort_left_open(w))
        else:
            w.end(step == "commit")
            w.close()
    script.steps.append((step, records))


def write(
    producer: str, bootstrap: str, topic: str, codec: str, steps: list[str], *, n: int = 6
) -> Script:
    """Write ``steps`` ("open" last, if at all) with one producer and codec, ``n`` records each."""
    script = Script()
    for i, step in enumerate(steps):
        write_step(
            script,
            producer,
            bootstrap,
            topic,
            codec,
            step,
            payloads(f"{producer}.{codec}.{step}{i}", n),
        )
    return script


def offsets_written(script: Script) -> int:
    """Offsets the script's records and the markers of its ended transactions take."""
    return sum(len(records) + (step in ("commit", "abort")) for step, records in script.steps)


def _log_end(bootstrap: str, topic: str) -> int:
    from pipeline.ingest.kafka.fetch import RangeReader

    reader = RangeReader(bootstrap, timeout_s=10, isolation_level="read_uncommitted")
    try:
        return reader.log_end(topic, 0, at=0)
    finally:
        reader.close()


def wait_for_stable_end(bootstrap: str, topic: str, expected: int, *, timeout_s: float = 20) -> int:
    """The read_committed end of partition 0, once it reaches ``expected`` (a transaction's
    marker is written after the commit returns); the last seen if it never does."""
    from pipeline.ingest.kafka.fetch import RangeReader

    reader = RangeReader(bootstrap, timeout_s=10)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            end = reader.log_end(topic, 0, at=0)
            if end >= expected or time.monotonic() > deadline:
                return end
            time.sleep(0.05)
    finally:
        reader.close()
