"""streamtrain's own Kafka source for Spark Structured Streaming (a Spark 4 Python data source).

It is what runs where Spark's ``spark-sql-kafka`` jar is not on the classpath.
Offsets are Spark's Kafka JSON form, ``{"topic": {"0": 42, "1": 17}}`` (the next
offset to read, per partition), written by Spark to the query's offset log before
a batch runs, so a replayed batch reads exactly the same ranges. The driver side
plans ranges with :func:`pipeline.ingest.offsets.plan`; each task reads its range with
raw Fetch requests (:mod:`pipeline.ingest.reader`): no consumer group, no committed
offsets in Kafka.

Options (as in Spark's Kafka source): ``kafka.bootstrap.servers``, ``subscribe``
(comma-separated topics) or ``subscribePattern``, ``startingOffsets`` (``earliest``,
``latest`` or JSON with -2 for earliest and -1 for latest), ``maxOffsetsPerTrigger``,
``minPartitions``, ``failOnDataLoss``, ``kafka.fetch.timeout.ms``, ``freshnessTarget`` (seconds:
each trigger plans what the measured training rate gets through in a share of it, between
``freshnessMinOffsets`` and ``maxOffsetsPerTrigger``: :mod:`pipeline.ingest.sizing`), and
``kafka.isolation.level`` (``read_committed``, the default here where Kafka's consumer
defaults to ``read_uncommitted``: batches end at the last stable offset and aborted
transactions are not read; or ``read_uncommitted``). ``kafkaConf`` names a Kafka client
properties file (TLS, SASL: :mod:`pipeline.ingest.kafka.conf`); the plan carries the path
alone, and the driver and each executor read the file themselves.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Iterator, Mapping
from typing import Any

from kafka.errors import KafkaError
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from pipeline.errors import ConfigError
from pipeline.ingest import columns, offsets, sizing
from pipeline.ingest.kafka.conf import load as load_kafka_conf
from pipeline.ingest.kafka.fetch import ConnectionLost, isolation_id
from pipeline.ingest.kafka.security import KafkaConf
from pipeline.ingest.offsets import OffsetRange, Offsets
from pipeline.ingest.reader import read_range

NAME = "streamtrain-kafka"

log = logging.getLogger(__name__)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans exact offset ranges on the driver and reads them on the executors."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.bootstrap = options.get("kafka.bootstrap.servers") or ""
        if not self.bootstrap:
            raise ConfigError("The Kafka source needs option kafka.bootstrap.servers (HOST:PORT).")
        topics, pattern = options.get("subscribe"), options.get("subscribePattern")
        if bool(topics) == bool(pattern):
            raise ConfigError(
                "The Kafka source needs exactly one of the options subscribe or subscribePattern."
            )
        self.topics = [t.strip() for t in topics.split(",") if t.strip()] if topics else []
        self.pattern = re.compile(pattern) if pattern else None
        self.starting = options.get("startingOffsets", "earliest")
        max_rows = options.get("maxOffsetsPerTrigger")
        self.max_rows = int(max_rows) if max_rows else None
        if self.max_rows is not None and self.max_rows < 1:
            raise ConfigError(f"Expected maxOffsetsPerTrigger >= 1. Received: {max_rows}")
        # Lives in this reader, which Spark keeps for the query's life, and plans only new
        # batches: a replayed one is read from Spark's offset log, never sized again.
        sized = sizing.Sizing.from_options(options)
        self.sizer = sizing.TriggerSizer(sized) if sized is not None else None
        self.min_partitions = int(options.get("minPartitions", "0") or 0)
        self.fail_on_data_loss = options.get("failOnDataLoss", "true").lower() != "false"
        self.fetch_timeout_s = int(options.get("kafka.fetch.timeout.ms", "60000")) / 1000
        self.isolation_level = options.get("kafka.isolation.level", "read_committed")
        isolation_id(self.isolation_level)  # fails early on a bad value
        # The path only: this reader is pickled into every task, and a password must not be.
        self.kafka_conf = options.get("kafkaConf") or None
        load_kafka_conf(self.kafka_conf)  # fails early on a bad file
        # Where the first batch's start is kept: "latest" must mean the same offsets
        # when a query that crashed before committing batch 0 is restarted.
        self.initial_path = options.get("initialOffsetsPath")
        self._target: Offsets | None = None  # Trigger.AvailableNow's end
        self._latest: Offsets | None = None  # the last log-end offsets seen
        self._outage_since: float | None = None  # Kafka unreachable since (time.monotonic())
        self._outage_logged = 0.0
        self._consumer: Any = None  # the driver's, kept between triggers (see _edges)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled into every task: the driver's consumer stays on the driver.
        return {**self.__dict__, "_consumer": None}

    def stop(self) -> None:
        """The query stopped: close the driver's consumer."""
        c, self._consumer = self._consumer, None
        if c is not None:
            c.close()

    # --- driver side ---

    @property
    def conf(self) -> KafkaConf:
        return load_kafka_conf(self.kafka_conf)

    def _edges(self, which: str) -> Offsets:
        """Earliest or latest offsets of every subscribed partition.

        One consumer serves every trigger: it is never assigned a partition and never
        polls, so it holds no fetch state between calls, only its connections and the
        cluster's metadata, which each call fetches afresh (a partition added since is
        seen). A fresh consumer per call made ``latestOffset`` take about 130 ms here,
        most of it the connection's set-up and the broker's version probe; with this one
        it takes about 17 ms (Apache Kafka, 2 cores). After an error it is dropped, and
        the next call connects anew.
        """
        from kafka import TopicPartition

        from pipeline.ingest.kafka import client

        if self._consumer is None:
            self._consumer = client.consumer(self.bootstrap, conf=self.conf)
        c = self._consumer
        try:
            listed = c.topics()  # the whole cluster's metadata, fetched now
            topics = self.topics or sorted(
                t for t in listed if self.pattern and self.pattern.fullmatch(t)
            )
            tps = [
                TopicPartition(t, p)
                for t in topics
                for p in sorted(c.partitions_for_topic(t) or [])
            ]
            found = (
                c.beginning_offsets(tps)
                if which == "earliest"
                else client.end_offsets(
                    c, tps, isolation_level=self.isolation_level, conf=self.conf
                )
            )
        except BaseException:
            with contextlib.suppress(Exception):  # the error that matters is the one raised
                self.stop()
            raise
        out: Offsets = {}
        for tp, offset in found.items():
            out.setdefault(tp.topic, {})[str(tp.partition)] = int(offset)
        if which == "latest":
            self._latest = out
        return out

    def initialOffset(self) -> dict:
        if self.initial_path and os.path.exists(self.initial_path):
            with open(self.initial_path) as f:
                kept: dict = json.load(f)
            return kept
        offsets = self._initial_offsets()
        if self.initial_path:
            os.makedirs(os.path.dirname(self.initial_path) or ".", exist_ok=True)
            tmp = f"{self.initial_path}.tmp"
            with open(tmp, "w") as f:
                json.dump(offsets, f)
            os.replace(tmp, self.initial_path)
        return offsets

    def _initial_offsets(self) -> Offsets:
        if self.starting in ("earliest", "latest"):
            return self._edges(self.starting)
        try:
            given = json.loads(self.starting)
        except json.JSONDecodeError:
            raise ConfigError(
                f'Expected startingOffsets earliest, latest or JSON like {{"topic": {{"0": 42}}}}. '
                f"Received: {self.starting!r}"
            ) from None
        earliest, latest = self._edges("earliest"), self._edges("latest")
        out: Offsets = {}
        for topic, parts in earliest.items():
            for p, low in parts.items():
                chosen = int(given.get(topic, {}).get(p, -2))
                out.setdefault(topic, {})[p] = (
                    low if chosen == -2 else latest[topic][p] if chosen == -1 else chosen
                )
        return out

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        if self._target is not None:
            end = self._target
        else:
            try:
                end = self._edges("latest")
            except (KafkaError, OSError, ConnectionLost) as e:
                return self._waiting(start, f"{type(e).__name__}: {e}")
            missing = [
                f"{t}-{p}" for t, parts in start.items() for p in parts if p not in end.get(t, {})
            ]
            if missing:  # a broker still loading its log after a restart lists no partitions yet
                return self._waiting(start, f"partitions {', '.join(missing)} not listed")
        self._outage_since = None
        # A partition that appeared after the start is read from its beginning.
        earliest: Offsets | None = None
        for topic, parts in end.items():
            for p in parts:
                if p not in start.get(topic, {}):
                    earliest = earliest or self._edges("earliest")
                    start = {**start, topic: {**start.get(topic, {}), p: earliest[topic][p]}}
        end = {
            t: {p: max(o, start.get(t, {}).get(p, 0)) for p, o in parts.items()}
            for t, parts in end.items()
        }
        if self.sizer is not None:  # before the cap: the sizer must see the whole backlog to grow
            pending = sum(
                o - start.get(t, {}).get(p, 0) for t, parts in end.items() for p, o in parts.items()
            )
            end = offsets.cap_offsets(
                start, end, self.sizer.plan(now=time.monotonic(), pending=pending)
            )
        if isinstance(limit, ReadMaxRows):
            end = offsets.cap_offsets(start, end, limit.max_rows)
        return end

    def _waiting(self, start: dict, why: str) -> dict:
        """While Kafka cannot be reached (a broker restarting), plan no batch: the query waits
        and retries at its next trigger instead of failing. Logged once, then every 30 s."""
        now = time.monotonic()
        if self._outage_since is None:
            self._outage_since, self._outage_logged = now, 0.0
        if now - self._outage_logged >= 30:
            self._outage_logged = now
            log.warning(
                "Kafka at %s unavailable for %.0f s (%s); the stream waits for it",
                self.bootstrap,
                now - self._outage_since,
                why,
            )
        self._latest = start
        return start

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def reportLatestOffset(self) -> dict | None:
        # Spark asks right after latestOffset(): the offsets just read serve, saving a round trip.
        return self._latest if self._latest is not None else self._edges("latest")

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._edges("latest")

    def partitions(self, start: dict, end: dict) -> list[OffsetRange]:
        return offsets.plan(start, end, min_partitions=self.min_partitions)

    def commit(self, end: dict) -> None:
        pass  # offsets live in Spark's checkpoint, not in Kafka

    # --- executor side ---

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, OffsetRange)
        yield from read_range(
            self.bootstrap,
            partition,
            fail_on_data_loss=self.fail_on_data_loss,
            timeout_s=self.fetch_timeout_s,
            isolation_level=self.isolation_level,
            kafka_conf=self.kafka_conf,
        )


class KafkaDataSource(DataSource):
    """``spark.readStream.format("streamtrain-kafka")``, once registered with :func:`register`."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return columns.spark_schema()

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return KafkaStreamReader(self.options)  # case-insensitive keys, as Spark options are


def register(spark: Any) -> None:
    """Make ``format("streamtrain-kafka")`` available in this Spark session."""
    spark.dataSource.register(KafkaDataSource)
