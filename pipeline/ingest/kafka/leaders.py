"""The leaders of topic partitions, and one connection to each broker that leads one.

A :class:`~pipeline.ingest.kafka.fetch.RangeReader` fetches a partition from its leader;
:class:`Leaders` finds that leader with a Metadata v4 request to any bootstrap broker
(still served by Kafka 4), keeps it until a fetch says it moved, and keeps one
:class:`~pipeline.ingest.kafka.wire.Connection` per broker address for reuse.
"""

from __future__ import annotations

import struct

from pipeline.errors import BrokerError
from pipeline.ingest.kafka.security import KafkaConf
from pipeline.ingest.kafka.wire import AuthenticationError, Connection, ConnectionLost, string

_METADATA = 3
#: Kafka's error codes a Metadata or Fetch response may carry, by name.
ERRORS = {
    1: "OFFSET_OUT_OF_RANGE",
    3: "UNKNOWN_TOPIC_OR_PARTITION",
    5: "LEADER_NOT_AVAILABLE",
    6: "NOT_LEADER_OR_FOLLOWER",
    35: "UNSUPPORTED_VERSION",
    74: "FENCED_LEADER_EPOCH",
    75: "UNKNOWN_LEADER_EPOCH",
    76: "UNSUPPORTED_COMPRESSION_TYPE",
}


class Leaders:
    """Partition leaders by ``(topic, partition)``, and the connections to them.

    Args:
        bootstrap: Kafka ``host:port[,host:port...]``.
        timeout_s: each connection's timeout.
        conf: the security settings of every connection.
    """

    def __init__(self, bootstrap: str, *, timeout_s: float, conf: KafkaConf) -> None:
        self.bootstrap = [
            (h, int(p)) for h, _, p in (b.strip().rpartition(":") for b in bootstrap.split(","))
        ]
        self.timeout_s, self.conf = timeout_s, conf
        self._conns: dict[tuple[str, int], Connection] = {}
        self._leaders: dict[tuple[str, int], tuple[str, int]] = {}

    def conn(self, address: tuple[str, int]) -> Connection:
        """The connection to ``address``, opened on first use."""
        conn = self._conns.get(address)
        if conn is None:
            conn = self._conns[address] = Connection(*address, self.timeout_s, self.conf)
        return conn

    def drop(self, address: tuple[str, int]) -> None:
        """Close the connection to ``address`` (the next use opens a new one)."""
        conn = self._conns.pop(address, None)
        if conn is not None:
            conn.close()

    def leader(self, topic: str, partition: int) -> tuple[str, int]:
        """The address of the partition's leader, asked for where it is not known."""
        key = (topic, partition)
        if key not in self._leaders:
            self._refresh(topic)
        if key not in self._leaders:
            raise BrokerError(f"Kafka reports no leader for {topic}-{partition}.")
        return self._leaders[key]

    def forget(self, topic: str, partition: int) -> None:
        """The partition's leader moved (or its broker failed): ask again next time."""
        self._leaders.pop((topic, partition), None)

    def _refresh(self, topic: str) -> None:
        """Leaders of ``topic``'s partitions, from a Metadata v4 request to any bootstrap broker."""
        errors = []
        for address in self.bootstrap:
            try:
                r = self.conn(address).request(
                    _METADATA, 4, struct.pack(">i", 1) + string(topic) + b"\x00"
                )
            except AuthenticationError:
                raise  # the same settings fail on every broker, now and later
            except (BrokerError, OSError) as e:
                self.drop(address)
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
                    raise BrokerError(f"Kafka has no topic {topic!r} ({ERRORS.get(error, error)}).")
            return
        raise ConnectionLost(
            f"Cannot reach Kafka at {','.join(f'{h}:{p}' for h, p in self.bootstrap)}: "
            + "; ".join(errors)
        )

    def close(self) -> None:
        """Close every connection."""
        for address in list(self._conns):
            self.drop(address)
