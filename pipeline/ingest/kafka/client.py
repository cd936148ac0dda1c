"""Kafka client helpers that are right on real Kafka and on the embedded Tansu broker.

Two Tansu quirks are handled here, once, for everything built on top:

* ListOffsets(LATEST) is wrong on Tansu: it answers the first offset of the last
  record batch + 1, not the end of the log. :func:`end_offsets` takes the end
  from a Fetch response's high watermark (or last stable offset) instead, which is
  right on both.
* Consumer-group joins take ~23 s on Tansu with the default 10 s session
  timeout, and ~3 s with 6 s. :func:`consumer` sets a short session timeout.

Every kafka-python client of streamtrain is built here (:func:`admin`, :func:`producer`,
:func:`consumer`), secured by a :class:`~pipeline.ingest.kafka.security.KafkaConf`.
"""

from __future__ import annotations

import contextlib
import struct
import time
from collections.abc import Iterable, Mapping
from typing import Any

from pipeline.errors import BrokerError, ConfigError
from pipeline.ingest.kafka.security import PLAINTEXT, KafkaConf

#: Group settings that make joins fast on Tansu and stay sane on real Kafka.
GROUP_DEFAULTS: dict[str, Any] = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}


def parse_bootstrap(bootstrap: str) -> str:
    """Validate ``host:port[,host:port...]``.

    >>> parse_bootstrap("127.0.0.1:9092")
    '127.0.0.1:9092'
    >>> parse_bootstrap("localhost")  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    pipeline.errors.ConfigError: Expected --bootstrap as HOST:PORT[,HOST:PORT...]. Received:
    'localhost'
    """
    for part in bootstrap.split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(
                f"Expected --bootstrap as HOST:PORT[,HOST:PORT...]. Received: {bootstrap!r}"
            )
    return bootstrap


def _unreachable(bootstrap: str, timeout_s: float, why: object) -> BrokerError:
    return BrokerError(
        f"Cannot reach Kafka at {bootstrap}: no broker answered within {timeout_s:.3g} s "
        f"({str(why).rstrip('.')}). Start one with `streamtrain broker`, or pass --bootstrap "
        "HOST:PORT of a running Kafka."
    )


def check_reachable(bootstrap: str, *, conf: KafkaConf = PLAINTEXT, timeout_s: float = 5.0) -> None:
    """Raise unless a broker of ``bootstrap`` answers a Metadata request in time, over TLS
    and SASL as ``conf`` says: a refused password, a certificate that does not verify or a
    listener of another protocol is one line (:class:`AuthenticationError`) within seconds,
    before anything starts. A broker that takes the connection but is slow to finish its
    TLS or SASL handshake (busy, as in a compose stack's start) is waited for, up to
    :data:`wire.HANDSHAKE_TIMEOUT_S` a try, and tried again until ``timeout_s`` has passed."""
    from pipeline.ingest.kafka import wire

    addresses = [
        (h, int(p))
        for h, _, p in (b.strip().rpartition(":") for b in parse_bootstrap(bootstrap).split(","))
    ]
    started = time.monotonic()
    deadline = started + timeout_s
    why: object = "no answer"
    closed = 0
    while True:
        for host, port in addresses:
            try:
                # ``timeout_s`` bounds finding a broker that takes the connection; one that
                # took it gets the whole handshake time (a busy broker's first TLS and SCRAM).
                conn = wire.Connection(
                    host,
                    port,
                    max(0.5, deadline - time.monotonic()),
                    conf,
                    handshake_s=wire.HANDSHAKE_TIMEOUT_S,
                )
            except wire.ConnectionLost as e:
                why = e
                continue
            try:
                conn.request(
                    3, 4, struct.pack(">i", 0) + b"\x00"
                )  # Metadata v4 of no topic: the brokers
                return
            except wire.SlowAnswer as e:
                why = e
            except wire.ConnectionLost as e:
                why = e
                # Accepted, then closed at the first request, twice: a TLS listener met with
                # plaintext closes so; a broker that is only starting refuses the connection.
                closed += conf.protocol == "PLAINTEXT"
                if closed >= 2:
                    raise wire.AuthenticationError(
                        f"The Kafka broker at {host}:{port} closed the connection at the first "
                        "plaintext request: its listener probably wants TLS (security.protocol "
                        "SSL or SASL_SSL in a --kafka-conf file)."
                    ) from None
            finally:
                conn.close()
        if time.monotonic() > deadline:
            raise _unreachable(bootstrap, max(timeout_s, time.monotonic() - started), why)
        time.sleep(0.2)


def admin(bootstrap: str, *, conf: KafkaConf = PLAINTEXT, **settings: Any) -> Any:
    """A kafka-python ``KafkaAdminClient`` for ``bootstrap``, secured as ``conf`` says.

    It connects as it is made: a Kafka that does not answer within its bootstrap timeout
    (30 s) is one line (:class:`BrokerError`), not kafka-python's traceback."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaTimeoutError

    try:
        return KafkaAdminClient(bootstrap_servers=bootstrap, **conf.kafka_python(), **settings)
    except KafkaTimeoutError as e:
        waited_s = settings.get("bootstrap_timeout_ms", 30_000) / 1000
        raise _unreachable(bootstrap, waited_s, e) from None


def producer(bootstrap: str, *, conf: KafkaConf = PLAINTEXT, **settings: Any) -> Any:
    """A kafka-python ``KafkaProducer`` for ``bootstrap``, secured as ``conf`` says."""
    from kafka import KafkaProducer

    return KafkaProducer(bootstrap_servers=bootstrap, **conf.kafka_python(), **settings)


def ensure_topic(
    bootstrap: str,
    topic: str,
    *,
    partitions: int = 2,
    replication: int = 1,
    conf: KafkaConf = PLAINTEXT,
) -> int:
    """Create ``topic`` if it does not exist; return its partition count."""
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    if partitions < 1:
        raise ConfigError(f"Expected --partitions >= 1. Received: {partitions}")
    client = admin(bootstrap, conf=conf)
    try:
        with contextlib.suppress(TopicAlreadyExistsError):
            client.create_topics([NewTopic(topic, partitions, replication)])
        deadline = time.monotonic() + 10
        while True:
            meta = client.describe_topics([topic])
            parts = meta[0].get("partitions") if meta else None
            if parts:
                return len(parts)
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"Topic {topic!r} was created on {bootstrap} but has no partitions after 10 s."
                )
            time.sleep(0.05)
    finally:
        client.close()


def consumer(
    bootstrap: str,
    *topics: str,
    group_id: str | None = None,
    conf: KafkaConf = PLAINTEXT,
    **kwargs: Any,
) -> Any:
    """A ``KafkaConsumer`` with settings that work on Tansu and real Kafka alike, secured
    as ``conf`` says.

    kafka-python reads gzip alone unless the codec libraries are installed; streamtrain
    declares them (``kafka-python[lz4,snappy,zstd]``), so it reads every codec too."""
    from kafka import KafkaConsumer

    settings: dict[str, Any] = {"fetch_max_wait_ms": 100, "enable_auto_commit": False}
    if group_id is not None:
        settings.update(GROUP_DEFAULTS)
    settings.update(kwargs)
    return KafkaConsumer(
        *topics, bootstrap_servers=bootstrap, group_id=group_id, **conf.kafka_python(), **settings
    )


def partitions_for(
    bootstrap_or_consumer: Any, topic: str, *, conf: KafkaConf = PLAINTEXT
) -> list[int]:
    """Partition ids of ``topic`` (empty when it does not exist)."""
    own = isinstance(bootstrap_or_consumer, str)
    c = consumer(bootstrap_or_consumer, conf=conf) if own else bootstrap_or_consumer
    try:
        return sorted(c.partitions_for_topic(topic) or [])
    finally:
        if own:
            c.close()


def end_offsets(
    c: Any,
    partitions: Iterable[Any],
    *,
    timeout_s: float = 10.0,
    isolation_level: str = "read_uncommitted",
    conf: KafkaConf = PLAINTEXT,
) -> dict[Any, int]:
    """The true log-end offset of each partition, read from Fetch responses: the high
    watermark, or with ``read_committed`` the last stable offset (below any open
    transaction: where a read_committed reader stops).

    ``c`` is a consumer made by :func:`consumer`, used for ListOffsets only.
    ListOffsets(LATEST) is a lower bound on Tansu (first offset of the last batch + 1),
    so one Fetch from one below it (an offset the log holds) answers the real end. That
    Fetch is raw (:class:`pipeline.ingest.kafka.fetch.RangeReader`) and decodes no record,
    so a batch no client can read never hides the end of its log.
    """
    from pipeline.ingest.kafka.fetch import RangeReader

    tps = list(partitions)
    if not tps:
        return {}
    reported: Mapping[Any, int] = c.end_offsets(tps)
    begin: Mapping[Any, int] = c.beginning_offsets(tps)
    servers = c.config["bootstrap_servers"]
    bootstrap = servers if isinstance(servers, str) else ",".join(servers)
    reader = RangeReader(bootstrap, timeout_s=timeout_s, isolation_level=isolation_level, conf=conf)
    try:
        return {
            tp: reader.log_end(tp.topic, tp.partition, at=max(begin[tp], reported[tp] - 1))
            for tp in tps
        }
    finally:
        reader.close()
