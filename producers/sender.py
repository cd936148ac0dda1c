"""A replay's sends: counted once Kafka acknowledges them, sent again after a failure worth
retrying (a broker restarting), flushed at the end within a deadline."""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from typing import Any

from pipeline.ingest.kafka import client
from pipeline.ingest.kafka.security import PLAINTEXT, KafkaConf
from pipeline.observe import metrics
from producers.report import ReplayReport

log = logging.getLogger(__name__)

#: Producer settings measured best for ~800-byte records on the embedded broker.
PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable_idempotence": True,
    "acks": "all",
    "linger_ms": 5,
    "batch_size": 1 << 20,
    "max_request_size": 4 << 20,
}

#: Times a record whose send failed for a reason worth retrying is sent again before it
#: counts as a send error (with waits of 0.4, 0.8, ... up to 5 s between: about half a minute).
RESENDS = 8


def _worth_resending(error: BaseException | None) -> bool:
    """Whether a failed send may succeed if sent again: Kafka's retriable errors, and the
    idempotent producer's sequence errors after a broker restarted and lost its producer
    state (kafka-python then takes a new epoch and fails what was in flight, unappended).

    >>> from kafka import errors
    >>> (
    ...     _worth_resending(errors.OutOfOrderSequenceNumberError()),
    ...     _worth_resending(errors.MessageSizeTooLargeError()),
    ... )
    (True, False)
    """
    return bool(getattr(error, "retriable", False)) or _lost_sequence(error)


def _close(producer: Any, *, timeout_s: float) -> None:
    """Close a producer; with Kafka away, kafka-python's close raises once its flush times
    out: what it held is counted unacknowledged by then."""
    from kafka.errors import KafkaError, KafkaTimeoutError

    try:
        producer.close(timeout=timeout_s)
        return
    except KafkaTimeoutError:
        pass
    # That close raised before it stopped the network thread, which would go on reconnecting to
    # the gone broker for the process's life (or until the garbage collector's close times out
    # in its turn). Stop it without sending; its batches fail, so a second close has nothing to
    # wait for.
    sender = getattr(producer, "_sender", None)
    if sender is not None:
        sender.force_close()
        sender.join(timeout_s)
    with contextlib.suppress(KafkaError):
        producer.close(timeout=0)


def _lost_sequence(error: BaseException | None) -> bool:
    """Whether the broker no longer knows the idempotent producer's sequence (it restarted)."""
    from kafka import errors

    return isinstance(
        error,
        (
            errors.OutOfOrderSequenceNumberError,
            errors.UnknownProducerIdError,
            errors.InvalidProducerEpochError,
        ),
    )


#: A send in flight: (futures, (value, key, partition) of each, resends so far).
_Pending = tuple[list[Any], list[tuple[bytes, bytes, int]], int]


class Sender:
    """Sends records to one topic from an idempotent producer and counts what Kafka acknowledged.

    Args:
        bootstrap, topic: where records go.
        labels: the metrics' labels, ``(topic, dataset name)``.
        meters: the producer metrics to count in.
        producer_config: the producer's settings (:data:`PRODUCER_DEFAULTS` and overrides).
        stopping: set when the replay stops (the wait before a resend ends early).
        conf: the Kafka client settings (TLS, SASL).
    """

    def __init__(
        self,
        *,
        bootstrap: str,
        topic: str,
        labels: tuple[str, str],
        meters: metrics.ProducerMetrics,
        producer_config: dict[str, Any],
        stopping: threading.Event,
        conf: KafkaConf = PLAINTEXT,
    ) -> None:
        self.bootstrap, self.topic, self.labels, self.conf = bootstrap, topic, labels, conf
        self.metrics, self.producer_config, self.stopping = meters, producer_config, stopping
        self._pending: collections.deque[_Pending] = collections.deque()
        self._producer: Any = None
        self._renew = False  # a sequence error was seen: replace the producer before sending again
        self._resend: collections.deque[tuple[list[tuple[bytes, bytes, int]], int]] = (
            collections.deque()
        )

    def open(self) -> None:
        self._producer = self._new_producer()

    def send(self, records: list[tuple[bytes, bytes, int]]) -> None:
        """Hand ``records`` (value, key, partition) to the producer."""
        send, topic = self._producer.send, self.topic
        futures = [send(topic, value, key, None, part) for value, key, part in records]
        self._pending.append((futures, records, 0))

    def settle(self, report: ReplayReport, *, block: bool) -> None:
        """Count acknowledged and failed sends, oldest first; stop at the first unfinished
        one unless ``block`` (after a flush, when all are finished). A send that failed for
        a reason worth retrying (a broker restarting, see :func:`_worth_resending`) goes to
        :attr:`_resend`, up to :data:`RESENDS` times."""
        labels = self.labels
        while self._pending:
            futures, records, tries = self._pending[0]
            # A slice's records go to several partitions, whose batches finish in any order:
            # the last one done says nothing of the others.
            if not block and not (futures[-1].is_done and all(f.is_done for f in futures)):
                return
            self._pending.popleft()
            again = [
                rec
                for f, rec in zip(futures, records, strict=True)
                if f.failed() and tries < RESENDS and _worth_resending(f.exception)
            ]
            self._renew = self._renew or any(
                f.failed() and _lost_sequence(f.exception) for f in futures
            )
            if again:
                self._resend.append((again, tries + 1))
            # After a flush that timed out, a send still unfinished is not acknowledged.
            failed = sum(1 for f in futures if f.failed() or not f.is_done) - len(again)
            ok = len(futures) - failed - len(again)
            report.records_sent += ok
            size = sum(
                len(rec[0])
                for f, rec in zip(futures, records, strict=True)
                if f.is_done and not f.failed()
            )
            report.bytes_sent += size
            report.send_errors += failed
            self.metrics.records_sent.labels(*labels).inc(ok)
            self.metrics.bytes_sent.labels(*labels).inc(size)
            if failed or again:
                first = next((f for f in futures if f.failed()), None)
                self.metrics.send_errors.labels(*labels).inc(failed)
                log.warning(
                    "%d records not acknowledged by Kafka (%d to send again): %s",
                    failed + len(again),
                    len(again),
                    first.exception if first is not None else "no answer in time",
                )

    def send_again(self) -> None:
        """Send the records whose sends failed for a reason worth retrying, after a short wait
        for the broker; their futures join the pending ones.

        After a sequence error the producer is replaced by a new one (a new producer id, no
        sequence history): kafka-python's own recovery (a new epoch, sequences renumbered
        while batches are in flight) lost acknowledged records on a restarted noida broker.
        """
        if self._renew:
            old, self._producer = self._producer, self._new_producer()
            _close(
                old, timeout_s=10
            )  # what it still had in flight settles (and may come back here)
            self._renew = False
        producer = self._producer
        if self._resend:  # one wait for all: a broker restart fails what was in flight at once
            self.stopping.wait(min(5.0, 0.2 * 2 ** max(tries for _, tries in self._resend)))
        while self._resend:
            records, tries = self._resend.popleft()
            futures = [
                producer.send(self.topic, value, key, None, part) for value, key, part in records
            ]
            self._pending.append((futures, records, tries))

    def drain(self, report: ReplayReport, *, within_s: float) -> None:
        """Wait for every send, sending again what failed for a reason worth retrying, within
        ``within_s`` in all (so a Ctrl-C while Kafka is away still reports soon);
        what is unacknowledged by then counts as send errors. A stop ends the replay; it
        does not drop records already taken from the data."""
        from kafka.errors import KafkaTimeoutError

        deadline = time.monotonic() + within_s
        while True:
            with contextlib.suppress(KafkaTimeoutError):
                self._producer.flush(timeout=max(0.1, deadline - time.monotonic()))
            self.settle(report, block=True)
            if not self._resend or time.monotonic() >= deadline:
                break
            self.send_again()
        unsent = sum(len(records) for records, _ in self._resend)
        if unsent:
            self._resend.clear()
            report.send_errors += unsent
            self.metrics.send_errors.labels(*self.labels).inc(unsent)
            log.warning("%d records still unacknowledged by Kafka after %g s", unsent, within_s)

    def _new_producer(self) -> Any:
        return client.producer(self.bootstrap, conf=self.conf, **self.producer_config)

    def close(self, *, timeout_s: float) -> None:
        _close(self._producer, timeout_s=timeout_s)
