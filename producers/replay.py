"""The replay producer: a dataset split into a Kafka topic, rate-limited, looped, keyed by id.

Records go out in the wire format of :mod:`pipeline.codec`, keyed by record id
(partition = id mod partitions, so a replay is spread evenly and the same record
always lands in the same partition), from an idempotent producer. Only records
Kafka acknowledged count as sent (:mod:`producers.sender`); the pace is
:mod:`producers.pacing`'s, the report :mod:`producers.report`'s, and the malformed rows
are watched by :mod:`producers.malformed`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from pipeline import codec, record_key
from pipeline.errors import ConfigError
from pipeline.ingest.kafka import client, conf
from pipeline.observe import exposition, metrics
from producers.datasets import Chunk, Dataset
from producers.malformed import MalformedRows
from producers.pacing import RateLimiter
from producers.report import MalformedSoFar, ReplayReport
from producers.sender import PRODUCER_DEFAULTS, Sender

log = logging.getLogger(__name__)

#: Seconds a finishing replay waits for Kafka to acknowledge what it sent (resends included).
FINAL_FLUSH_S = 30.0


class Replay:
    """Replays one split of a dataset into a topic.

    Args:
        dataset: a dataset reader.
        bootstrap: Kafka ``host:port``.
        kafka_conf: a Kafka client properties file (TLS, SASL), read here; None: PLAINTEXT.
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
        on_malformed: called with a :class:`~producers.report.MalformedSoFar` after each
            chunk that set rows aside (how a run hears of them as they happen).
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
        kafka_conf: str | None = None,
        on_malformed: Callable[[MalformedSoFar], None] | None = None,
    ) -> None:
        self.metrics = meters or metrics.producer_metrics()
        self.malformed = MalformedRows(
            dataset, meters=self.metrics, max_malformed=max_malformed, on_malformed=on_malformed
        )
        if limit is not None and limit < 0:
            raise ConfigError(f"Expected --limit >= 0. Received: {limit}")
        if epochs is not None and epochs < 1:
            raise ConfigError(f"Expected --epochs >= 1. Received: {epochs}")
        self.dataset = dataset
        self.bootstrap = client.parse_bootstrap(bootstrap)
        self.conf = conf.load(kafka_conf)
        self.topic = topic
        #: Set to stop the replay: it stops sending, flushes and reports (see :meth:`stop`).
        self.stopping = stop or threading.Event()
        self.limiter = RateLimiter(rate, sleep=self.stopping.wait)
        self.loop = loop or epochs is not None
        self.limit = limit
        self.epochs = epochs
        self.split = split
        self.partitions = partitions
        # Series exist at 0 from the start, so a first error is a rate, not a new series.
        self.metrics.send_errors.labels(self.topic, self.dataset.name)
        self.producer_config = {**PRODUCER_DEFAULTS, **(producer_config or {})}
        self.progress = progress
        self._sender = Sender(
            bootstrap=self.bootstrap,
            topic=topic,
            labels=(topic, dataset.name),
            meters=self.metrics,
            producer_config=self.producer_config,
            stopping=self.stopping,
            conf=self.conf,
        )
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
        client.check_reachable(self.bootstrap, conf=self.conf)
        partitions = client.ensure_topic(
            self.bootstrap, self.topic, partitions=self.partitions, conf=self.conf
        )
        if self.resume:
            self._skip = self._already_there(partitions)
            report.resumed_after = int(self._skip.sum())
        if self.stopping.is_set():
            return self._interrupted_before_start(report, started)
        self._sender.open()
        self.metrics.target_rate.labels(self.topic).set(self.limiter.rate or 0)
        total = self._total()
        if total is not None and self._skip is not None:
            total = max(0, total - int(self._skip.sum()))
        bar = _progress_bar(total, self.topic) if self.progress else None
        try:
            self._send(partitions, report, bar)
        except (
            KeyboardInterrupt
        ):  # no signal handler installed (a library caller): the default Ctrl-C
            report.interrupted = True
        finally:
            self._sender.drain(report, within_s=FINAL_FLUSH_S)
            self._sender.close(timeout_s=5)
            if bar is not None:
                bar.close()
            report.seconds = time.monotonic() - started
            self.malformed.finish(report)
        if not report.interrupted:
            self.malformed.check(final=True)
        return report

    def _already_there(self, partitions: int) -> np.ndarray:
        """Each partition's log end: offsets are never reused, so it counts every record ever
        appended, by this replay's earlier runs (a topic only it writes to)."""
        from kafka import TopicPartition

        c = client.consumer(self.bootstrap, conf=self.conf)
        try:
            tps = [TopicPartition(self.topic, p) for p in range(partitions)]
            ends = client.end_offsets(c, tps, conf=self.conf)
        finally:
            c.close()
        return np.array([ends[tp] for tp in tps], np.int64)

    def _interrupted_before_start(self, report: ReplayReport, started: float) -> ReplayReport:
        report.interrupted = True
        report.seconds = time.monotonic() - started
        self.malformed.finish(report)
        return report

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
            # A table's rows come in its own format; a built-in dataset's are encoded here.
            values = (
                chunk.values
                if chunk.values is not None
                else codec.encode(chunk.x, chunk.y, self.dataset.schema)
            )
            keys = record_key.encode_keys(chunk.ids)
            parts_array = (chunk.ids % np.uint64(partitions)).astype(np.int64)
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
                self._sender.send([(values[i], keys[i], parts[i]) for i in batch])
                sent += len(batch)
                if bar is not None:
                    bar.update(len(batch))
                # Count acknowledgements as they come, so the sent-records rate is smooth
                # even when a rate-limited chunk takes many seconds.
                self._sender.settle(report, block=False)
                self._sender.send_again()
            handed += n
            self.malformed.count()
            self.malformed.check(final=False)
            if self.limit is not None and handed >= self.limit:
                # Before asking for another chunk, so a partial pass is not counted as an epoch.
                return


def _progress_bar(total: int | None, topic: str) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total, unit="rec", unit_scale=True, desc=f"→ {topic}", smoothing=0.1, mininterval=0.5
    )


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


def replay_with_metrics(
    dataset: Dataset, *, metrics_host: str = "127.0.0.1", metrics_port: int = 0, **options: Any
) -> ReplayReport:
    """Run a :class:`Replay` of ``dataset`` (``options`` are its arguments) while serving its
    Prometheus ``/metrics`` on ``metrics_host:metrics_port``; return its report."""
    meters = metrics.producer_metrics()
    replay = Replay(dataset, meters=meters, **options)
    server = exposition.serve(meters.registry, host=metrics_host, port=metrics_port)
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
