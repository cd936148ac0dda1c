"""The replay producer: a dataset split into a Kafka topic, rate-limited, looped, keyed by id.

Records go out in the wire format of :mod:`pipeline.codec`, keyed by record id
(partition = id mod partitions, so a replay is spread evenly and the same record
always lands in the same partition), from an idempotent producer. Only records
Kafka acknowledged count as sent.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from pipeline import codec
from pipeline.errors import ConfigError, DataError
from pipeline.ingest.kafka import client
from pipeline.observe import metrics
from producers.datasets import Chunk, Dataset
from producers.datasets.base import MALFORMED_REASONS

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
#: Seconds a finishing replay waits for Kafka to acknowledge what it sent (resends included).
FINAL_FLUSH_S = 30.0


def _worth_resending(error: BaseException | None) -> bool:
    """Whether a failed send may succeed if sent again: Kafka's retriable errors, and the
    idempotent producer's sequence errors after a broker restarted and lost its producer
    state (kafka-python then takes a new epoch and fails what was in flight, unappended).

    >>> from kafka import errors
    >>> _worth_resending(errors.OutOfOrderSequenceNumberError()), _worth_resending(errors.MessageSizeTooLargeError())
    (True, False)
    """
    return bool(getattr(error, "retriable", False)) or _lost_sequence(error)


def _close(producer: Any, *, timeout_s: float) -> None:
    """Close a producer; with Kafka away, kafka-python's close raises once its flush times
    out: what it held is counted unacknowledged by then."""
    from kafka.errors import KafkaTimeoutError

    with contextlib.suppress(KafkaTimeoutError):
        producer.close(timeout=timeout_s)


def _lost_sequence(error: BaseException | None) -> bool:
    """Whether the broker no longer knows the idempotent producer's sequence (it restarted)."""
    from kafka import errors

    return isinstance(error, (errors.OutOfOrderSequenceNumberError, errors.UnknownProducerIdError,
                              errors.InvalidProducerEpochError))


class RateLimiter:
    """Paces a sender to ``rate`` records/s on average since start (no burst debt beyond it).

    Example:
        >>> now = [0.0]
        >>> limiter = RateLimiter(100, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
        >>> limiter.wait(50); now[0]
        0.5
        >>> limiter.wait(50); now[0]     # already on schedule: no extra sleep
        0.5
    """

    def __init__(
        self,
        rate: float | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        if rate is not None and rate <= 0:
            raise ConfigError(f"Expected --rate > 0 records/s (or none for full speed). Received: {rate}")
        self.rate = rate
        self._clock, self._sleep = clock, sleep
        self._start = clock()

    def wait(self, sent: int) -> None:
        """Sleep until ``sent`` records are due."""
        if self.rate is None:
            return
        ahead = self._start + sent / self.rate - self._clock()
        if ahead > 0:
            self._sleep(ahead)

    def slice_size(self) -> int:
        """Records to send between waits: ~100 waits a second, at least 1."""
        return 4096 if self.rate is None else max(1, int(self.rate / 100))


@dataclasses.dataclass
class ReplayReport:
    """What a replay did. ``records_sent`` counts acknowledged records only."""

    topic: str
    records_sent: int = 0
    bytes_sent: int = 0
    send_errors: int = 0
    malformed: int = 0
    malformed_by_reason: dict[str, int] = dataclasses.field(default_factory=dict)
    malformed_examples: list[tuple[int, str]] = dataclasses.field(default_factory=list)  # (line, reason)
    epochs: int = 0
    seconds: float = 0.0
    interrupted: bool = False
    resumed_after: int = 0  # records of this replay already in the topic, not sent again

    @property
    def records_per_s(self) -> float:
        return self.records_sent / self.seconds if self.seconds else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes_sent / self.seconds / 1e6 if self.seconds else 0.0

    def summary(self) -> str:
        """One line for people.

        >>> ReplayReport("t", records_sent=10, bytes_sent=8000, seconds=2.0).summary()
        'sent 10 records (0.0 MB) to t in 2.0 s: 5 records/s, 0.00 MB/s; 0 send errors, 0 malformed rows skipped'
        >>> ReplayReport("t", malformed=2, malformed_examples=[(3, "not_a_number"), (9, "bad_label")]).summary().split("; ")[1]
        '0 send errors, 2 malformed rows skipped (line 3: not_a_number, line 9: bad_label)'
        """
        stopped = " (interrupted)" if self.interrupted else ""
        if self.resumed_after:
            stopped += f" (resumed after the {self.resumed_after} records already there)"
        return (
            f"sent {self.records_sent} records ({self.bytes_sent / 1e6:.1f} MB) to {self.topic} in "
            f"{self.seconds:.1f} s{stopped}: {self.records_per_s:.0f} records/s, {self.mb_per_s:.2f} MB/s; "
            f"{self.send_errors} send errors, {self.malformed} malformed rows skipped{self.malformed_detail()}"
        )

    def malformed_detail(self) -> str:
        """`` (line 3: not_a_number, ...)`` for the first malformed rows, or nothing."""
        return _malformed_detail(self.malformed, self.malformed_examples)


def _malformed_detail(malformed: int, examples: list[tuple[int, str]]) -> str:
    """The first malformed rows by line and reason, for a summary or an error.

    >>> _malformed_detail(3, [(3, "not_a_number")])
    ' (line 3: not_a_number, ...)'
    """
    if not examples:
        return ""
    more = ", ..." if malformed > len(examples) else ""
    return " (" + ", ".join(f"line {n}: {why}" for n, why in examples) + more + ")"


class Replay:
    """Replays one split of a dataset into a topic.

    Args:
        dataset: a dataset reader.
        bootstrap: Kafka ``host:port``.
        topic: destination; created with ``partitions`` partitions if missing.
        rate: records/s, or None for full speed.
        loop: start over at the end of the split, until ``limit``, ``epochs`` or Ctrl-C.
        limit: stop after this many records.
        epochs: stop after this many complete passes over the split (implies ``loop``).
        split: ``train`` (default) or ``test``.
        meters: the producer metrics to count in (a fresh set if None).
        producer_config: overrides of :data:`PRODUCER_DEFAULTS`.
        progress: show a progress bar with records/s.
        max_malformed: fail (:class:`~pipeline.errors.DataError`) once more rows than this
            are malformed: a count (>= 1), or a fraction of the rows read (< 1, checked
            from 1,000 rows on and at the end of the data). None: never.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        bootstrap: str,
        topic: str,
        rate: float | None = None,
        loop: bool = False,
        limit: int | None = None,
        epochs: int | None = None,
        split: str = "train",
        partitions: int = 2,
        meters: metrics.ProducerMetrics | None = None,
        producer_config: dict[str, Any] | None = None,
        progress: bool = False,
        max_malformed: float | None = None,
        stop: threading.Event | None = None,
        resume: bool = False,
    ) -> None:
        if max_malformed is not None and max_malformed < 0:
            raise ConfigError(f"Expected --max-malformed >= 0 (a count, or a fraction below 1). Received: {max_malformed}")
        if limit is not None and limit < 0:
            raise ConfigError(f"Expected --limit >= 0. Received: {limit}")
        if epochs is not None and epochs < 1:
            raise ConfigError(f"Expected --epochs >= 1. Received: {epochs}")
        self.dataset = dataset
        self.bootstrap = client.parse_bootstrap(bootstrap)
        self.topic = topic
        #: Set to stop the replay: it stops sending, flushes and reports (see :meth:`stop`).
        self.stopping = stop or threading.Event()
        self.limiter = RateLimiter(rate, sleep=self.stopping.wait)
        self.loop = loop or epochs is not None
        self.limit = limit
        self.epochs = epochs
        self.split = split
        self.partitions = partitions
        self.metrics = meters or metrics.producer_metrics()
        # Series exist at 0 from the start, so a first error is a rate, not a new series.
        self.metrics.send_errors.labels(self.topic, self.dataset.name)
        for reason in MALFORMED_REASONS:
            self.metrics.malformed_rows.labels(self.dataset.name, reason)
        self._malformed_counted: dict[str, int] = {}
        self.max_malformed = max_malformed
        self.producer_config = {**PRODUCER_DEFAULTS, **(producer_config or {})}
        self.progress = progress
        #: Sends not yet counted: (futures, record size, (value, key, partition) of each, resends so far).
        self._pending: collections.deque[tuple[list[Any], int, list[tuple[bytes, bytes, int]], int]] = \
            collections.deque()
        self._producer: Any = None
        self._renew = False  # a sequence error was seen: replace the producer before sending again
        self._resend: collections.deque[tuple[list[tuple[bytes, bytes, int]], int, int]] = collections.deque()
        #: Resuming: records of each partition already in the topic (this replay's order is
        #: deterministic, so they are the first that many bound for it); None: send all.
        self.resume = resume
        self._skip: np.ndarray | None = None

    def _chunks(self, report: ReplayReport) -> Iterator[Chunk]:
        while True:
            empty = True
            for chunk in self.dataset.iter_chunks(self.split, chunk_rows=4096):
                empty = False
                yield chunk
            report.epochs += 1
            self.metrics.epochs.labels(self.topic, self.dataset.name).inc()
            if not self.loop or empty or (self.epochs is not None and report.epochs >= self.epochs):
                return

    def _settle(self, report: ReplayReport, *, block: bool) -> None:
        """Count acknowledged and failed sends, oldest first; stop at the first unfinished
        one unless ``block`` (after a flush, when all are finished). A send that failed for
        a reason worth retrying (a broker restarting, see :func:`_worth_resending`) goes to
        :attr:`_resend`, up to :data:`RESENDS` times."""
        labels = (self.topic, self.dataset.name)
        while self._pending:
            futures, size, records, tries = self._pending[0]
            # A slice's records go to several partitions, whose batches finish in any order:
            # the last one done says nothing of the others.
            if not block and not (futures[-1].is_done and all(f.is_done for f in futures)):
                return
            self._pending.popleft()
            again = [rec for f, rec in zip(futures, records, strict=True)
                     if f.failed() and tries < RESENDS and _worth_resending(f.exception)]
            self._renew = self._renew or any(f.failed() and _lost_sequence(f.exception) for f in futures)
            if again:
                self._resend.append((again, size, tries + 1))
            # After a flush that timed out, a send still unfinished is not acknowledged.
            failed = sum(1 for f in futures if f.failed() or not f.is_done) - len(again)
            ok = len(futures) - failed - len(again)
            report.records_sent += ok
            report.bytes_sent += ok * size
            report.send_errors += failed
            self.metrics.records_sent.labels(*labels).inc(ok)
            self.metrics.bytes_sent.labels(*labels).inc(ok * size)
            if failed or again:
                first = next((f for f in futures if f.failed()), None)
                self.metrics.send_errors.labels(*labels).inc(failed)
                log.warning("%d records not acknowledged by Kafka (%d to send again): %s", failed + len(again),
                            len(again), first.exception if first is not None else "no answer in time")

    def _send_again(self) -> None:
        """Send the records whose sends failed for a reason worth retrying, after a short wait
        for the broker; their futures join the pending ones.

        After a sequence error the producer is replaced by a new one (a new producer id, no
        sequence history): kafka-python's own recovery (a new epoch, sequences renumbered
        while batches are in flight) lost acknowledged records on a restarted noida broker.
        """
        if self._renew:
            old, self._producer = self._producer, self._new_producer()
            _close(old, timeout_s=10)  # what it still had in flight settles (and may come back here)
            self._renew = False
        producer = self._producer
        if self._resend:  # one wait for all: a broker restart fails what was in flight at once
            self.stopping.wait(min(5.0, 0.2 * 2 ** max(tries for _, _, tries in self._resend)))
        while self._resend:
            records, size, tries = self._resend.popleft()
            futures = [producer.send(self.topic, value, key, None, part) for value, key, part in records]
            self._pending.append((futures, size, records, tries))

    def stop(self) -> None:
        """Ask a running replay to stop; safe from a signal handler or another thread."""
        self.stopping.set()

    def run(self) -> ReplayReport:
        """Send until the split ends (or ``limit``, or :meth:`stop`, or Ctrl-C); flush; report."""
        report = ReplayReport(self.topic)
        started = time.monotonic()
        # Each start-up step is bounded by its own timeout, and a stop asked for during
        # one ends the replay before the next.
        if self.stopping.is_set():
            return self._interrupted_before_start(report, started)
        client.check_reachable(self.bootstrap)
        partitions = client.ensure_topic(self.bootstrap, self.topic, partitions=self.partitions)
        if self.resume:
            self._skip = self._already_there(partitions)
            report.resumed_after = int(self._skip.sum())
        if self.stopping.is_set():
            return self._interrupted_before_start(report, started)
        self._producer = self._new_producer()
        self.metrics.target_rate.labels(self.topic).set(self.limiter.rate or 0)
        total = self._total()
        if total is not None and self._skip is not None:
            total = max(0, total - int(self._skip.sum()))
        bar = _progress_bar(total, self.topic) if self.progress else None
        try:
            self._send(partitions, report, bar)
        except KeyboardInterrupt:  # no signal handler installed (a library caller): the default Ctrl-C
            report.interrupted = True
        finally:
            self._drain(report)
            _close(self._producer, timeout_s=5)
            if bar is not None:
                bar.close()
            report.seconds = time.monotonic() - started
            self._finish(report)
        if not report.interrupted:
            self._check_malformed(final=True)
        return report

    def _already_there(self, partitions: int) -> np.ndarray:
        """Each partition's log end: offsets are never reused, so it counts every record ever
        appended, by this replay's earlier runs (a topic only it writes to)."""
        from kafka import TopicPartition

        c = client.consumer(self.bootstrap)
        try:
            tps = [TopicPartition(self.topic, p) for p in range(partitions)]
            ends = client.end_offsets(c, tps)
        finally:
            c.close()
        return np.array([ends[tp] for tp in tps], np.int64)

    def _drain(self, report: ReplayReport) -> None:
        """Wait for every send, sending again what failed for a reason worth retrying, within
        :data:`FINAL_FLUSH_S` in all (so a Ctrl-C while Kafka is away still reports soon);
        what is unacknowledged by then counts as send errors. A stop ends the replay; it
        does not drop records already taken from the data."""
        from kafka.errors import KafkaTimeoutError

        deadline = time.monotonic() + FINAL_FLUSH_S
        while True:
            with contextlib.suppress(KafkaTimeoutError):
                self._producer.flush(timeout=max(0.1, deadline - time.monotonic()))
            self._settle(report, block=True)
            if not self._resend or time.monotonic() >= deadline:
                break
            self._send_again()
        unsent = sum(len(records) for records, _, _ in self._resend)
        if unsent:
            self._resend.clear()
            report.send_errors += unsent
            self.metrics.send_errors.labels(self.topic, self.dataset.name).inc(unsent)
            log.warning("%d records still unacknowledged by Kafka after %g s", unsent, FINAL_FLUSH_S)

    def _new_producer(self) -> Any:
        from kafka import KafkaProducer

        return KafkaProducer(bootstrap_servers=self.bootstrap, **self.producer_config)

    def _interrupted_before_start(self, report: ReplayReport, started: float) -> ReplayReport:
        report.interrupted = True
        report.seconds = time.monotonic() - started
        self._finish(report)
        return report

    def _finish(self, report: ReplayReport) -> None:
        data = self.dataset
        report.malformed, report.malformed_by_reason = data.malformed, dict(data.malformed_by_reason)
        report.malformed_examples = list(data.malformed_examples)
        self._count_malformed()

    def _total(self) -> int | None:
        """Records this replay will send, when that is known (for the progress bar)."""
        rows = self.dataset.num_rows(self.split)
        if self.limit is not None:
            return self.limit
        if self.epochs is not None and rows is not None:
            return rows * self.epochs
        return None if self.loop else rows

    def _send(self, partitions: int, report: ReplayReport, bar: Any) -> None:
        handed = 0  # records of the replay's order passed, sent or (resuming) already in the topic
        sent = 0  # records handed to the producer by this process: what the rate applies to
        step = self.limiter.slice_size()
        for chunk in self._chunks(report):
            values = codec.encode(chunk.x, chunk.y, self.dataset.schema)
            keys = codec.encode_keys(chunk.ids)
            parts_array = (chunk.ids % np.uint64(partitions)).astype(np.int64)
            size = self.dataset.schema.record_bytes
            n = len(values) if self.limit is None else min(len(values), self.limit - handed)
            order = np.arange(n)
            if self._skip is not None and self._skip.any():
                order = np.flatnonzero(skip_mask(parts_array[:n], self._skip))
            parts = parts_array.tolist()
            for lo in range(0, len(order), step):
                self.limiter.wait(sent)
                if self.stopping.is_set():
                    report.interrupted = True
                    return
                batch = order[lo : lo + step].tolist()
                send = self._producer.send
                futures = [send(self.topic, values[i], keys[i], None, parts[i]) for i in batch]
                self._pending.append((futures, size, [(values[i], keys[i], parts[i]) for i in batch], 0))
                sent += len(batch)
                if bar is not None:
                    bar.update(len(batch))
                # Count acknowledgements as they come, so the sent-records rate is smooth
                # even when a rate-limited chunk takes many seconds.
                self._settle(report, block=False)
                self._send_again()
            handed += n
            self._count_malformed()
            self._check_malformed(final=False)
            if self.limit is not None and handed >= self.limit:
                return  # before asking for another chunk, so a partial pass is not counted as an epoch

    def _count_malformed(self) -> None:
        for reason, n in self.dataset.malformed_by_reason.items():
            new = n - self._malformed_counted.get(reason, 0)
            if new:
                self.metrics.malformed_rows.labels(self.dataset.name, reason).inc(new)
                self._malformed_counted[reason] = n

    def _check_malformed(self, *, final: bool) -> None:
        """Fail once the malformed rows pass ``max_malformed``."""
        limit, data = self.max_malformed, self.dataset
        if limit is None or not data.malformed:
            return
        if limit >= 1:
            failed, allowed = data.malformed > limit, f"{limit:g} rows"
        else:
            failed = (final or data.rows_read >= 1000) and data.malformed > limit * max(1, data.rows_read)
            allowed = f"{limit:.0%} of the rows"
        if failed:
            detail = _malformed_detail(data.malformed, data.malformed_examples)
            raise DataError(f"Expected at most {allowed} of {data.name} to be malformed (--max-malformed). "
                            f"Received: {data.malformed} of {data.rows_read} rows read{detail}. Fix the file, "
                            "or raise --max-malformed.")


def _progress_bar(total: int | None, topic: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="rec", unit_scale=True, desc=f"→ {topic}", smoothing=0.1, mininterval=0.5)


def skip_mask(parts: np.ndarray, remaining: np.ndarray) -> np.ndarray:
    """Which records of a chunk to send, resuming: the first ``remaining[p]`` records bound
    for partition ``p`` are in the topic already (``remaining`` is updated in place).

    >>> left = np.array([1, 2])
    >>> skip_mask(np.array([0, 1, 0, 1, 1]), left).tolist(), left.tolist()
    ([False, False, True, False, True], [0, 0])
    """
    keep = np.ones(len(parts), bool)
    for p in np.flatnonzero(remaining):
        first = np.flatnonzero(parts == p)[: remaining[p]]
        keep[first] = False
        remaining[p] -= len(first)
    return keep


def replay_with_metrics(dataset: Dataset, *, metrics_host: str = "127.0.0.1", metrics_port: int = 0,
                        **options: Any) -> ReplayReport:
    """Run a :class:`Replay` of ``dataset`` (``options`` are its arguments) while serving its
    Prometheus ``/metrics`` on ``metrics_host:metrics_port``; return its report."""
    meters = metrics.producer_metrics()
    replay = Replay(dataset, meters=meters, **options)
    server = metrics.serve(meters.registry, host=metrics_host, port=metrics_port)
    log.info("producer metrics at %s", server.url)
    try:
        report = replay.run()
        # Watched by Prometheus: one more scrape, so the final counts are recorded (not
        # after Ctrl-C, which wants the process gone).
        if not report.interrupted:
            server.await_scrape()
        return report
    finally:
        server.stop()
