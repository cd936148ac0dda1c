"""Exact offset ranges read with Kafka's Fetch request and parsed with numpy.

kafka-python turns every record into Python objects (deserializers, a namedtuple,
header sizes: several microseconds each), which made the consumer, not Spark, the
ceiling of streamtrain's Python source. A micro-batch needs only the bytes of
``[start, end)`` of each partition as Arrow columns. This module speaks just enough of
the protocol for that over a plain socket: Metadata v4 to find partition leaders and
Fetch v4 (both still served by Kafka 4); the record batches in a response are parsed
by :mod:`pipeline.ingest.kafka.record_batch`. PLAINTEXT listeners only, like the rest
of streamtrain's Kafka clients today.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

from pipeline.errors import BrokerError
from pipeline.ingest.kafka.record_batch import Records, parse_batches

_FETCH, _METADATA = 1, 3
_ERRORS = {1: "OFFSET_OUT_OF_RANGE", 3: "UNKNOWN_TOPIC_OR_PARTITION", 5: "LEADER_NOT_AVAILABLE",
           6: "NOT_LEADER_OR_FOLLOWER", 74: "FENCED_LEADER_EPOCH", 75: "UNKNOWN_LEADER_EPOCH"}
_STALE_LEADER = {3, 5, 6, 74, 75}


class OffsetOutOfRange(BrokerError):
    """The broker no longer (or not yet) has the requested offset."""


class ConnectionLost(BrokerError):
    """A broker could not be reached or dropped the connection (worth retrying)."""


# --- wire helpers -----------------------------------------------------------------------


def _string(s: str | None) -> bytes:
    if s is None:
        return struct.pack(">h", -1)
    raw = s.encode()
    return struct.pack(">h", len(raw)) + raw


class _Reader:
    """Big-endian fields from a response, in order."""

    def __init__(self, data: bytes | bytearray) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str | None:
        n = self.take(">h")
        if n < 0:
            return None
        value = self.data[self.pos:self.pos + n].decode()
        self.pos += n
        return value

    def bytes_(self) -> memoryview | None:
        n = self.take(">i")
        if n < 0:
            return None
        value = memoryview(self.data)[self.pos:self.pos + n]
        self.pos += n
        return value


class _Connection:
    """One broker connection: length-prefixed requests and responses, one at a time."""

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as e:
            raise ConnectionLost(f"Cannot connect to the Kafka broker at {host}:{port} ({e}).") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.correlation = 0

    def request(self, api_key: int, version: int, body: bytes) -> _Reader:
        self.correlation += 1
        header = struct.pack(">hhi", api_key, version, self.correlation) + _string("streamtrain")
        frame = header + body
        try:
            self.sock.sendall(struct.pack(">i", len(frame)) + frame)
            size = struct.unpack(">i", self._read(4))[0]
            data = self._read(size)
        except OSError as e:  # timeouts included
            raise ConnectionLost(f"Kafka request failed ({type(e).__name__}: {e}).") from None
        if struct.unpack_from(">i", data)[0] != self.correlation:
            raise BrokerError("Kafka answered a different request than the one sent (correlation id mismatch).")
        reader = _Reader(data)
        reader.pos = 4
        return reader

    def _read(self, n: int) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if not k:
                raise ConnectionLost("The Kafka broker closed the connection.")
            got += k
        return buf

    def close(self) -> None:
        self.sock.close()


# --- record batches ---------------------------------------------------------------------


class RangeReader:
    """Reads ``[start, end)`` of topic-partitions from their leaders; reuse one per process.

    Example (needs a broker, so not run here)::

        reader = RangeReader("127.0.0.1:9092")
        for records in reader.read("mnist", 0, 0, 1000):
            print(len(records), records.offsets[:3])
    """

    def __init__(self, bootstrap: str, *, timeout_s: float = 30.0, max_partition_bytes: int = 16 << 20) -> None:
        self.bootstrap = [(h, int(p)) for h, _, p in (b.strip().rpartition(":") for b in bootstrap.split(","))]
        self.timeout_s = timeout_s
        self.max_partition_bytes = max_partition_bytes
        self._conns: dict[tuple[str, int], _Connection] = {}
        self._leaders: dict[tuple[str, int], tuple[str, int]] = {}

    def _conn(self, address: tuple[str, int]) -> _Connection:
        conn = self._conns.get(address)
        if conn is None:
            conn = self._conns[address] = _Connection(*address, self.timeout_s)
        return conn

    def _drop(self, address: tuple[str, int]) -> None:
        conn = self._conns.pop(address, None)
        if conn is not None:
            conn.close()

    def _refresh(self, topic: str) -> None:
        """Leaders of ``topic``'s partitions, from a Metadata v4 request to any bootstrap broker."""
        errors = []
        for address in self.bootstrap:
            try:
                r = self._conn(address).request(_METADATA, 4, struct.pack(">i", 1) + _string(topic) + b"\x00")
            except (BrokerError, OSError) as e:
                self._drop(address)
                errors.append(f"{address[0]}:{address[1]}: {e}")
                continue
            r.take(">i")  # throttle
            brokers = {}
            for _ in range(r.take(">i")):
                node, host, port = r.take(">i"), r.string(), r.take(">i")
                r.string()  # rack
                brokers[node] = (host or "", port)
            r.string()  # cluster id
            r.take(">i")  # controller
            for _ in range(r.take(">i")):
                error, name = r.take(">h"), r.string()
                r.take(">?")
                for _ in range(r.take(">i")):
                    _, partition, leader = r.take(">h"), r.take(">i"), r.take(">i")
                    for _ in range(2):  # replicas, isr: skip the broker ids
                        count = r.take(">i")
                        r.pos += 4 * max(count, 0)
                    if leader in brokers and name is not None:
                        self._leaders[(name, partition)] = brokers[leader]
                if error and name == topic:
                    raise BrokerError(f"Kafka has no topic {topic!r} ({_ERRORS.get(error, error)}).")
            return
        raise ConnectionLost(f"Cannot reach Kafka at {','.join(f'{h}:{p}' for h, p in self.bootstrap)}: "
                          + "; ".join(errors))

    def _fetch(self, topic: str, partition: int, offset: int, max_bytes: int) -> tuple[memoryview | None, int]:
        key = (topic, partition)
        if key not in self._leaders:
            self._refresh(topic)
        if key not in self._leaders:
            raise BrokerError(f"Kafka reports no leader for {topic}-{partition}.")
        address = self._leaders[key]
        body = (struct.pack(">iiiib", -1, 100, 1, max_bytes, 0) + struct.pack(">i", 1) + _string(topic)
                + struct.pack(">iiqi", 1, partition, offset, max_bytes))
        try:
            r = self._conn(address).request(_FETCH, 4, body)
        except (BrokerError, OSError):
            self._drop(address)
            self._leaders.pop(key, None)
            raise
        r.take(">i")  # throttle
        for _ in range(r.take(">i")):
            r.string()
            for _ in range(r.take(">i")):
                _, error, high_watermark = r.take(">i"), r.take(">h"), r.take(">q")
                r.take(">q")  # last stable offset
                aborted = r.take(">i")
                r.pos += 16 * max(aborted, 0)
                records = r.bytes_()
                if error in _STALE_LEADER:
                    self._leaders.pop(key, None)
                    return None, high_watermark
                if error == 1:
                    raise OffsetOutOfRange(f"Offset {offset} of {topic}-{partition} is out of range "
                                           "(deleted by retention, or beyond the end of the log).")
                if error:
                    raise BrokerError(f"Kafka refused to fetch {topic}-{partition}: {_ERRORS.get(error, error)}.")
                return records, high_watermark
        return None, -1

    def read(self, topic: str, partition: int, start: int, end: int) -> Iterator[Records]:
        """Yield :class:`Records` covering ``[start, end)`` in order; raises :class:`BrokerError`
        if the range cannot be read within the timeout (and :class:`OffsetOutOfRange` if
        its first records are gone)."""
        position, max_bytes = start, self.max_partition_bytes
        deadline = time.monotonic() + self.timeout_s
        while position < end:
            try:
                records, _ = self._fetch(topic, partition, position, max_bytes)
            except ConnectionLost:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)  # a restarting broker: reconnect and ask again
                continue
            got, next_offset = parse_batches(records, start=position, end=end) if records else ([], position)
            if got:
                deadline = time.monotonic() + self.timeout_s
                yield from got
            if records is None:
                time.sleep(0.1)  # the leader moved or is being elected: ask again shortly
            if next_offset > position:
                position = next_offset
            elif records is not None and len(records) >= max_bytes:
                max_bytes *= 2  # one batch is bigger than the limit: ask for more
            elif time.monotonic() > deadline:
                raise BrokerError(f"Kafka returned nothing for {topic}-{partition} at offset {position} "
                                  f"(wanted up to {end}) within {self.timeout_s:g} s.")

    def close(self) -> None:
        for address in list(self._conns):
            self._drop(address)
