"""Exact offset ranges read with Kafka's Fetch request and parsed with numpy.

kafka-python turns every record into Python objects (deserializers, a namedtuple,
header sizes: several microseconds each), which made the consumer, not Spark, the
ceiling of streamtrain's Python source. A micro-batch needs only the bytes of
``[start, end)`` of each partition as Arrow columns. This module speaks just enough of
the protocol for that over a plain socket: Metadata v4 to find partition leaders and
Fetch v10 (both still served by Kafka 4; v10 is the first Kafka sends zstd batches to);
the leaders and the connections to them are kept by :mod:`pipeline.ingest.kafka.leaders`,
the record batches in a response are parsed by :mod:`pipeline.ingest.kafka.record_batch`.
Connections speak TLS and SASL as the client configuration says (:mod:`pipeline.ingest.kafka.wire`).

Isolation is Kafka's: ``read_committed`` (the default, as exactly-once pipelines need)
fetches up to the last stable offset and drops the records of aborted transactions,
using the aborted-transaction list of each fetch response; ``read_uncommitted`` reads
up to the high watermark and keeps them. Transaction markers are skipped either way.
"""

from __future__ import annotations

import dataclasses
import struct
import time
from collections.abc import Iterator

from pipeline.errors import BrokerError, ConfigError
from pipeline.ingest.kafka import compression
from pipeline.ingest.kafka.leaders import ERRORS, Leaders
from pipeline.ingest.kafka.record_batch import Records, Skipped, UnreadableBatch, parse_batches
from pipeline.ingest.kafka.security import PLAINTEXT, KafkaConf
from pipeline.ingest.kafka.wire import ConnectionLost, Reader, string

_FETCH = 1
_STALE_LEADER = {3, 5, 6, 74, 75}

#: Kafka's isolation levels, by the id a Fetch request carries.
ISOLATION_LEVELS = {"read_uncommitted": 0, "read_committed": 1}


def isolation_id(level: str) -> int:
    """The Fetch request's id for isolation ``level``.

    >>> isolation_id("read_committed")
    1
    >>> isolation_id("committed")  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    pipeline.errors.ConfigError: Expected --isolation-level read_committed or read_uncommitted.
    Received: 'committed'
    """
    if level not in ISOLATION_LEVELS:
        raise ConfigError(
            f"Expected --isolation-level read_committed or read_uncommitted. Received: {level!r}"
        )
    return ISOLATION_LEVELS[level]


class OffsetOutOfRange(BrokerError):
    """The broker no longer (or not yet) has the requested offset."""


class UnreadableRange(BrokerError):
    """A range holds a batch this reader cannot read (never retried: the same bytes fail
    the same way). One line: topic, partition, offset and cause."""

    def __init__(self, topic: str, partition: int, batch: UnreadableBatch) -> None:
        super().__init__(
            f"Cannot read {topic}-{partition} at offset {batch.offset}: {batch.cause}. "
            "The stream stops before its micro-batch (docs/kafka.md: Record format)."
        )
        self.topic, self.partition, self.offset, self.cause = (
            topic,
            partition,
            batch.offset,
            batch.cause,
        )

    @classmethod
    def from_message(cls, message: str) -> UnreadableRange | None:
        """Rebuild the error from its message (an executor's error reaches the driver as text).

        >>> e = UnreadableRange("t-1", 3, UnreadableBatch(40, "record format v1"))
        >>> again = UnreadableRange.from_message(str(e))
        >>> again.topic, again.partition, again.offset, again.cause
        ('t-1', 3, 40, 'record format v1')
        """
        import re

        m = re.match(
            r"Cannot read (.+)-(\d+) at offset (-?\d+): (.*)\. The stream stops before", message
        )
        if m is None:
            return None
        return cls(m[1], int(m[2]), UnreadableBatch(int(m[3]), m[4]))


@dataclasses.dataclass
class Fetched:
    """One partition's part of a Fetch response.

    Attributes:
        records: the record set (None: nothing, or the leader moved).
        high_watermark: the end of the log that every replica holds.
        last_stable: the end of what read_committed may read (below any open transaction).
        aborted: (producer id, first offset) of the aborted transactions in the records.
    """

    records: memoryview | None
    high_watermark: int
    last_stable: int
    aborted: list[tuple[int, int]]


#: A Fetch response's overhead beyond its byte limit.
_FETCH_OVERHEAD = 1 << 20


# --- record batches ---------------------------------------------------------------------


class RangeReader:
    """Reads ``[start, end)`` of topic-partitions from their leaders; reuse one per process.

    Example (needs a broker, so not run here)::

        reader = RangeReader("127.0.0.1:9092", conf=conf.load("client.properties"))
        for records in reader.read("mnist", 0, 0, 1000):
            print(len(records), records.offsets[:3])
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        timeout_s: float = 30.0,
        max_partition_bytes: int = 16 << 20,
        isolation_level: str = "read_committed",
        max_batch_bytes: int = compression.DEFAULT_MAX_BYTES,
        conf: KafkaConf = PLAINTEXT,
    ) -> None:
        self.conf = conf
        self.timeout_s = timeout_s
        self.max_partition_bytes = max_partition_bytes
        self.isolation_level = isolation_level
        self._isolation = isolation_id(isolation_level)
        self.max_batch_bytes = max_batch_bytes
        self._leaders = Leaders(bootstrap, timeout_s=timeout_s, conf=conf)

    def _fetch(
        self, topic: str, partition: int, offset: int, max_bytes: int, *, wait_ms: int = 100
    ) -> Fetched:
        address = self._leaders.leader(topic, partition)
        # Fetch v10 (no fetch session: id 0, epoch -1): Kafka refuses to send zstd batches
        # to a Fetch below v10 (UNSUPPORTED_COMPRESSION_TYPE), whatever the client can inflate.
        body = (
            struct.pack(">iiiibii", -1, wait_ms, 1, max_bytes, self._isolation, 0, -1)
            + struct.pack(">i", 1)
            + string(topic)
            + struct.pack(">iiiqqi", 1, partition, -1, offset, -1, max_bytes)
            + struct.pack(">i", 0)
        )
        try:
            # Kafka sends a first batch whole however large (KIP-74): up to the batch cap. A
            # response past what was asked is cut (noida-db ignores the limit and sends the
            # rest of the log): a batch cut in two is asked for again with a larger limit.
            r = self._leaders.conn(address).request(
                _FETCH,
                10,
                body,
                most=max(max_bytes, self.max_batch_bytes) + _FETCH_OVERHEAD,
                cut_at=max_bytes + _FETCH_OVERHEAD,
            )
        except (BrokerError, OSError):
            self._leaders.drop(address)
            self._leaders.forget(topic, partition)
            raise
        if r.cut:
            self._leaders.drop(address)  # closed mid-response: the next request reconnects
        try:
            return self._fetched(r, topic, partition, offset)
        except (struct.error, ValueError, UnicodeDecodeError) as e:
            self._leaders.drop(address)  # out of step with the broker: a new connection
            raise BrokerError(
                f"Kafka's Fetch response for {topic}-{partition} at offset {offset} is malformed "
                f"({e})."
            ) from None

    def _fetched(self, r: Reader, topic: str, partition: int, offset: int) -> Fetched:
        """The partition's part of a Fetch response."""
        r.take(">i")  # throttle
        if (error := r.take(">h")) != 0:
            raise BrokerError(
                f"Kafka refused to fetch {topic}-{partition}: {ERRORS.get(error, error)}."
            )
        r.take(">i")  # session id
        for _ in range(r.take(">i")):
            r.string()
            for _ in range(r.take(">i")):
                _, error, high_watermark, last_stable = (
                    r.take(">i"),
                    r.take(">h"),
                    r.take(">q"),
                    r.take(">q"),
                )
                r.take(">q")  # log start offset
                aborted = [(r.take(">q"), r.take(">q")) for _ in range(max(r.take(">i"), 0))]
                records = r.bytes_()
                if error in _STALE_LEADER:
                    self._leaders.forget(topic, partition)
                    return Fetched(None, high_watermark, last_stable, aborted)
                if error == 1:
                    raise OffsetOutOfRange(
                        f"Offset {offset} of {topic}-{partition} is out of range "
                        "(deleted by retention, or beyond the end of the log)."
                    )
                if error:
                    raise BrokerError(
                        f"Kafka refused to fetch {topic}-{partition}: {ERRORS.get(error, error)}."
                    )
                return Fetched(records, high_watermark, last_stable, aborted)
        return Fetched(None, -1, -1, [])

    def log_end(self, topic: str, partition: int, *, at: int) -> int:
        """Where a reader of this isolation level stops today: the last stable offset
        (read_committed) or the high watermark, from one Fetch at offset ``at`` (any
        offset the log holds). No record is decoded, so no codec or corrupt batch can
        make the end unknown."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                # An empty log answers within 1 ms rather than the reader's 100 ms wait for
                # data (Tansu answers a 0 ms wait with no partition at all).
                got = self._fetch(topic, partition, at, 1, wait_ms=1)
            except ConnectionLost:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
                continue
            if got.high_watermark >= 0:
                # A broker that does not track the stable offset answers -1 for it.
                stable = got.last_stable if got.last_stable >= 0 else got.high_watermark
                return stable if self._isolation else got.high_watermark
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"Kafka gave no log end for {topic}-{partition} within {self.timeout_s:g} s."
                )
            time.sleep(0.1)

    def read(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int,
        *,
        skipped: Skipped | None = None,
        on_poison: str = "fail",
    ) -> Iterator[Records]:
        """Yield :class:`Records` covering ``[start, end)`` in order; raises :class:`BrokerError`
        if the range cannot be read within the timeout (:class:`OffsetOutOfRange` if its
        first records are gone, :class:`UnreadableRange` for a batch that cannot be read).
        Aborted transactions' records (read_committed) and markers are added to ``skipped``,
        and with ``on_poison="skip"`` the batches that cannot be read, passed over."""
        position, max_bytes = start, self.max_partition_bytes
        committed = self._isolation == 1
        deadline = time.monotonic() + self.timeout_s
        stable = -1
        while position < end:
            try:
                got = self._fetch(topic, partition, position, max_bytes)
            except ConnectionLost:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)  # a restarting broker: reconnect and ask again
                continue
            records, stable = got.records, got.last_stable
            try:
                found, next_offset = (
                    parse_batches(
                        records,
                        start=position,
                        end=end,
                        aborted=got.aborted if committed else None,
                        skipped=skipped,
                        max_batch_bytes=self.max_batch_bytes,
                        on_poison=on_poison,
                    )
                    if records
                    else ([], position)
                )
            except UnreadableBatch as e:
                raise UnreadableRange(topic, partition, e) from None
            if found:
                deadline = time.monotonic() + self.timeout_s
                yield from found
            if records is None:
                time.sleep(0.1)  # the leader moved or is being elected: ask again shortly
            if next_offset > position:
                position = next_offset
                deadline = time.monotonic() + self.timeout_s
            elif records is not None and len(records) >= max_bytes:
                # One batch is bigger than the limit: ask for more, up to the largest batch read.
                if max_bytes >= self.max_batch_bytes + _FETCH_OVERHEAD:
                    raise UnreadableRange(
                        topic,
                        partition,
                        UnreadableBatch(
                            position,
                            f"a batch larger than {max_bytes:,} bytes (the cap is "
                            f"{self.max_batch_bytes:,})",
                        ),
                    )
                max_bytes = min(2 * max_bytes, self.max_batch_bytes + _FETCH_OVERHEAD)
            elif time.monotonic() > deadline:
                open_txn = (
                    f"; a transaction still open at offset {stable} holds the rest back "
                    "(read_committed)"
                    if committed and 0 <= stable <= position
                    else ""
                )
                raise BrokerError(
                    f"Kafka returned nothing for {topic}-{partition} at offset {position} "
                    f"(wanted up to {end}) within {self.timeout_s:g} s{open_txn}."
                )

    def close(self) -> None:
        self._leaders.close()
