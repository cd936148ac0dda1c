"""Secured Kafka (issues 38 and 54): Apache Kafka's own broker requiring SASL_SSL (SCRAM-SHA-256,
SCRAM-SHA-512 and PLAIN users made the way Kafka makes them), and mutual TLS.

librdkafka (confluent-kafka) writes the records, zstd-compressed in a transaction, as a
team's producers do; streamtrain's Fetch reader and its kafka-python fallback read them
through TLS and SASL, authenticating again within the session lifetime the broker grants
(``connections.max.reauth.ms``), and every failure a wrong setting causes is one line within
10 s. The brokers are tests/ingest/secure_kafka.py's: one KRaft JVM each, configured in its
properties as an operator would; nothing here needs a stand-in for the broker any more.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import TopicPartition

from pipeline import codec, record_key
from pipeline.errors import BrokerError
from pipeline.ingest import reader
from pipeline.ingest.kafka import client, conf, wire
from pipeline.ingest.kafka.fetch import RangeReader
from pipeline.ingest.offsets import OffsetRange
from producers import datasets
from tests.ingest.secure_kafka import MECHANISMS, SecureKafka

ROOT = Path(__file__).resolve().parents[2]
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@pytest.fixture(scope="module")
def scram(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    """SASL_SSL, SCRAM-SHA-512 only: what a managed Kafka asks of a new client. Two more
    listeners of the same JVM present a certificate for another name and an expired one."""
    with SecureKafka(
        tmp_path_factory.mktemp("scram"),
        mode="sasl_ssl",
        mechanisms=("SCRAM-SHA-512",),
        more_certs=("wrong_name", "expired"),
    ) as kafka:
        yield kafka


@pytest.fixture(scope="module")
def every_mechanism(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    """SASL_SSL offering SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN, granting 1.5 s sessions: Kafka
    takes a connection's re-authentications at most once a second (a handshake sooner is
    refused and the connection closed), so a lifetime much under that cannot be kept."""
    with SecureKafka(
        tmp_path_factory.mktemp("every-mechanism"), mode="sasl_ssl", session_lifetime_ms=1500
    ) as kafka:
        yield kafka


@pytest.fixture(scope="module")
def mtls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    """TLS that requires a client certificate signed by the cluster's CA."""
    with SecureKafka(tmp_path_factory.mktemp("mtls"), mode="mtls") as kafka:
        yield kafka


def higgs_records(n: int) -> tuple[list[bytes], list[bytes]]:
    """The first ``n`` HIGGS sample rows in the wire format, and their keys."""
    chunk = next(datasets.get("higgs").iter_chunks("train", chunk_rows=n))
    return codec.encode(chunk.x[:n], chunk.y[:n], codec.HIGGS), record_key.encode_keys(
        chunk.ids[:n]
    )


def write_transaction(
    kafka: SecureKafka,
    topic: str,
    values: list[bytes],
    keys: list[bytes],
    *,
    mechanism: str | None = None,
) -> None:
    """librdkafka writes ``values`` to partition 0, zstd, in one committed transaction,
    logged in with ``mechanism`` (default: the broker's first)."""
    from confluent_kafka import Producer

    producer = Producer(
        kafka.confluent_conf(
            mechanism=mechanism,
            extra={
                "transactional.id": f"tx-{uuid.uuid4().hex[:8]}",
                "compression.type": "zstd",
                "linger.ms": 5,
            },
        )
    )
    producer.init_transactions(15)
    producer.begin_transaction()
    for key, value in zip(keys, values, strict=True):
        producer.produce(topic, value=value, key=key, partition=0)
    producer.commit_transaction(30)


def _values(fetch: RangeReader, topic: str, end: int) -> list[bytes]:
    return [
        bytes(rec.value_data[rec.value_offsets[i] : rec.value_offsets[i + 1]])
        for rec in fetch.read(topic, 0, 0, end)
        for i in range(len(rec))
    ]


def _secured_topic(kafka: SecureKafka, path: Path, n: int) -> tuple[str, list[bytes]]:
    topic = f"secured-{uuid.uuid4().hex[:8]}"
    client.ensure_topic(
        kafka.bootstrap, topic, partitions=1, conf=conf.load(path)
    )  # kafka-python's admin
    values, keys = higgs_records(n)
    write_transaction(kafka, topic, values, keys, mechanism=conf.load(path).mechanism)
    return topic, values


@pytest.mark.slow  # a broker JVM of its own and seconds of TLS and SASL: full tier only
@pytest.mark.parametrize("which", ["scram", "mtls"])
def test_the_fetch_reader_and_the_fallback_read_a_transaction_through_tls_and_sasl(
    which: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    kafka: SecureKafka = request.getfixturevalue(which)
    path = kafka.write_client_properties(tmp_path / "client.properties")
    topic, values = _secured_topic(kafka, path, 500)
    secured = conf.load(path)
    consumer = client.consumer(
        kafka.bootstrap, conf=secured
    )  # kafka-python, through the same TLS and SASL
    try:
        last = next(
            iter(client.end_offsets(consumer, [TopicPartition(topic, 0)], conf=secured).values())
        )
    finally:
        consumer.close()
    assert last == 501  # 500 records and the commit marker
    fetch = RangeReader(kafka.bootstrap, conf=secured, timeout_s=10)
    try:
        got = _values(fetch, topic, last)
    finally:
        fetch.close()
    assert got == values
    r = OffsetRange(topic, 0, 0, last)
    fallback = [
        v
        for batch in reader._read_with_consumer(
            kafka.bootstrap, r, timeout_s=20, kafka_conf=str(path)
        )
        for v in batch.column("value").to_pylist()
    ]
    assert fallback == values
    # librdkafka from the same file: KafkaConf.librdkafka() is what a confluent-kafka client takes.
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as RdPartition

    rd = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            **secured.librdkafka(),
        }
    )
    try:
        rd.assign([RdPartition(topic, 0, 0)])
        got_rd: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got_rd) < len(values) and time.monotonic() < deadline:
            got_rd += [m.value() for m in rd.consume(500, timeout=1) if m.error() is None]
    finally:
        rd.close()
    assert got_rd == values


@pytest.mark.slow  # a broker JVM of its own and seconds of TLS and SASL: full tier only
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_scram_sha_256_scram_sha_512_and_plain_each_log_in(
    every_mechanism: SecureKafka, mechanism: str, tmp_path: Path
) -> None:
    """Kafka's SCRAM users (made at format time, as ``kafka-storage format --add-scram``
    makes them) and PLAIN users (the listener's JAAS): librdkafka writes with each mechanism,
    the Fetch reader reads with the same client file."""
    kafka = every_mechanism
    path = kafka.write_client_properties(tmp_path / "client.properties", mechanism=mechanism)
    topic, values = _secured_topic(kafka, path, 200)
    fetch = RangeReader(kafka.bootstrap, conf=conf.load(path), timeout_s=10)
    try:
        assert _values(fetch, topic, 201) == values
    finally:
        fetch.close()


@pytest.mark.slow  # a broker JVM of its own and seconds of TLS and SASL: full tier only
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_the_fetch_reader_authenticates_again_within_the_session_lifetime(
    every_mechanism: SecureKafka, mechanism: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KIP-368: Kafka grants a 1.5 s session (``connections.max.reauth.ms``) and closes a
    connection used after it without authenticating again; the reader's one connection keeps
    reading past several lifetimes, authenticating again on the way."""
    kafka = every_mechanism
    path = kafka.write_client_properties(tmp_path / "client.properties", mechanism=mechanism)
    topic, values = _secured_topic(kafka, path, 50)
    secured = conf.load(path)
    logins: list[wire.Connection] = []
    login = wire.Connection._authenticate

    def counted(conn: wire.Connection) -> None:
        logins.append(conn)
        login(conn)

    monkeypatch.setattr(wire.Connection, "_authenticate", counted)
    fetch = RangeReader(kafka.bootstrap, conf=secured, timeout_s=10)
    try:
        deadline, reads = time.monotonic() + 4.5, 0
        while time.monotonic() < deadline:  # bounded: 4.5 s of reads, 3 lifetimes
            assert _values(fetch, topic, 51) == values
            reads += 1
            time.sleep(0.2)
        conns = fetch._leaders._conns
        assert len(conns) == 1
        conn = next(iter(conns.values()))
        assert conn.correlation > reads
        assert len(logins) >= 3 and all(c is conn for c in logins), len(logins)
    finally:
        fetch.close()
    # What the reader's logins answer: Kafka closes a connection that does not log in again.
    host, port = kafka.bootstrap.rsplit(":", 1)
    stale = wire.Connection(host, int(port), 5, secured)
    try:
        stale._reauth_at = float("inf")
        time.sleep(1.7)
        with pytest.raises(wire.ConnectionLost):
            stale.request(3, 4, b"\x00\x00\x00\x00\x00")  # Metadata v4 of no topic
    finally:
        stale.close()


def _run_cli(*args: str, timeout_s: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
    )
    return done, time.monotonic() - started


class Refusal:
    """`streamtrain run` started with a client file a test made wrong; :meth:`line` waits for
    it and returns its one error line, having checked the exit status, the time, that no
    traceback was printed, no password shown and nothing left behind."""

    def __init__(
        self,
        kafka: SecureKafka,
        tmp_path: Path,
        *,
        bootstrap: str | None = None,
        path: Path | None = None,
        **settings: Any,
    ) -> None:
        name = uuid.uuid4().hex[:6]
        self.path = path or kafka.write_client_properties(
            tmp_path / f"c-{name}.properties", **settings
        )
        self.out, self.secret = tmp_path / f"run-{name}", kafka.password
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipeline",
                "run",
                "--dataset",
                "higgs",
                "--bootstrap",
                bootstrap or kafka.bootstrap,
                "--kafka-conf",
                str(self.path),
                "--out",
                str(self.out),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        self.ended: float | None = None

    def done(self) -> bool:
        if self.ended is None and self.proc.poll() is not None:
            self.ended = time.monotonic()
        return self.ended is not None

    def line(self) -> str:
        stdout, stderr = self.proc.communicate(timeout=60)
        took = (self.ended or time.monotonic()) - self.started
        lines = stderr.strip().splitlines()
        assert (
            self.proc.returncode == 2 and lines and lines[-1].startswith("streamtrain: error: ")
        ), stderr[-3000:]
        assert "Traceback" not in stderr, stderr[-3000:]
        assert took < 10, f"{took:.1f} s: {lines[-1]}"
        assert not self.out.exists()
        assert self.secret not in stderr + stdout
        return lines[-1]


@pytest.mark.slow  # 8 to 15 s (eight `streamtrain run` processes): full tier only
def test_every_wrong_setting_is_one_line_within_10_s(
    scram: SecureKafka, mtls: SecureKafka, tmp_path: Path
) -> None:
    """Each case is a `streamtrain run` of its own (each must end within 10 s), against Apache
    Kafka's listeners: the wrong name and the expired certificate are two more listeners of
    the ``scram`` broker. Kafka answers each in milliseconds; a run's ~2 s are its Python
    start-up, so at most one run per core goes at once: eight start-ups on two cores would
    time the cores, not the refusal (measured: 10.7 to 13.6 s each, 2 s alone)."""
    plain = tmp_path / "plain.properties"
    plain.write_text("security.protocol=PLAINTEXT\n")
    cases = {
        "TLS at plaintext": functools.partial(
            Refusal, scram, tmp_path, bootstrap=scram.plain_bootstrap
        ),
        "password": functools.partial(Refusal, scram, tmp_path, password="not-the-password"),
        # The broker offers SCRAM-SHA-512 only.
        "mechanism": functools.partial(Refusal, scram, tmp_path, mechanism="PLAIN"),
        "other CA": functools.partial(Refusal, scram, tmp_path, ca=scram.pki.other_ca),
        "no client certificate": functools.partial(Refusal, mtls, tmp_path, client_cert=False),
        # Neither this nor the first hangs.
        "plaintext at TLS": functools.partial(Refusal, mtls, tmp_path, path=plain),
        **{
            which: functools.partial(Refusal, scram, tmp_path, bootstrap=scram.bootstraps[which])
            for which in ("wrong_name", "expired")
        },
    }
    runs: dict[str, Refusal] = {}
    deadline = time.monotonic() + 90
    while len(runs) < len(cases) or not all([run.done() for run in runs.values()]):
        assert time.monotonic() < deadline, {case: run.done() for case, run in runs.items()}
        if len(runs) < len(cases) and sum([not run.done() for run in runs.values()]) < _CORES:
            case = list(cases)[len(runs)]
            runs[case] = cases[case]()
        time.sleep(0.05)  # each one's end is taken when it exits, not when it is read
    lines = {case: run.line() for case, run in runs.items()}
    assert f"refused user {scram.username!r} with SASL SCRAM-SHA-512" in lines["password"], lines
    assert scram.bootstrap in lines["password"]
    assert "does not offer SASL PLAIN (it offers SCRAM-SHA-512)" in lines["mechanism"], lines
    assert (
        "certificate that does not verify" in lines["other CA"]
        and "ssl.ca.location" in lines["other CA"]
    )
    assert "client certificate" in lines["no client certificate"], lines
    assert (
        "does not speak TLS" in lines["TLS at plaintext"]
        or "TLS handshake" in lines["TLS at plaintext"]
    ), lines
    assert "wants TLS" in lines["plaintext at TLS"], lines
    assert "must name the host" in lines["wrong_name"] and "expired" in lines["expired"], lines


@pytest.mark.slow  # a broker JVM of its own and seconds of TLS and SASL: full tier only
def test_the_fetch_reader_never_retries_a_refused_login(scram: SecureKafka, tmp_path: Path) -> None:
    """A refused password is raised at once, not retried until the read's timeout."""
    path = scram.write_client_properties(tmp_path / "bad.properties", password="wrong")
    fetch = RangeReader(scram.bootstrap, conf=conf.load(path), timeout_s=30)
    started = time.monotonic()
    with pytest.raises(wire.AuthenticationError, match="refused user"):
        list(fetch.read("any", 0, 0, 1))
    assert time.monotonic() - started < 5
    assert isinstance(wire.AuthenticationError("x"), BrokerError)


class _LateRelay:
    """A loopback relay to a broker that holds each connection ``delay_s`` before it forwards
    a byte: a broker that takes the connection at once and answers late, as a busy one does."""

    def __init__(self, target: str, delay_s: float) -> None:
        host, _, port = target.rpartition(":")
        self.target, self.delay_s = (host, int(port)), delay_s
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.1)
        self.bootstrap = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.done = threading.Event()
        self.sockets: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while not self.done.is_set():
            with contextlib.suppress(TimeoutError):
                conn = self.server.accept()[0]
                self.sockets.append(conn)
                threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        if self.done.wait(self.delay_s):
            return
        upstream = socket.create_connection(self.target, timeout=10)
        self.sockets.append(upstream)
        for a, b in ((conn, upstream), (upstream, conn)):
            pump = threading.Thread(target=self._pump, args=(a, b), daemon=True)
            self.threads.append(pump)
            pump.start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):  # either end closed: the relay's end too
            while data := source.recv(65536):
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.done.set()
        for conn in self.sockets:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        for thread in self.threads:
            thread.join(5)
        self.server.close()


@pytest.mark.slow  # a broker JVM of its own and seconds of TLS and SASL: full tier only
def test_a_broker_that_answers_its_first_tls_handshake_late_is_waited_for(
    scram: SecureKafka, tmp_path: Path
) -> None:
    """Apache Kafka's SASL_SSL listener behind a relay that answers 6 s late: the start-up
    probe (5 s) waits for the handshake of a connection the broker took, and logs in. In a
    compose stack's start a busy broker's first TLS handshake took that long, and the
    producer exited 2 with "its port is probably PLAINTEXT"."""
    path = scram.write_client_properties(tmp_path / "client.properties")
    relay = _LateRelay(scram.bootstrap, delay_s=6)
    try:
        started = time.monotonic()
        client.check_reachable(relay.bootstrap, conf=conf.load(path), timeout_s=5)
        assert time.monotonic() - started >= 6  # the relay's delay was waited out
    finally:
        relay.close()


@pytest.mark.slow  # a broker JVM of its own and seconds of TLS and SASL: full tier only
def test_the_stacks_generated_credentials_log_in_to_a_broker_that_requires_them(
    tmp_path: Path,
) -> None:
    """`streamtrain secrets --kafka-broker --kafka-client` (the compose stack's secured variant):
    the broker's certificate verifies against the client file's CA for 127.0.0.1, and the
    SCRAM user's password the broker is given is the client's."""
    (tmp_path / "broker").mkdir()
    (tmp_path / "secrets").mkdir()
    client_file = tmp_path / "secrets" / "kafka-client.properties"
    done, _ = _run_cli(
        "secrets", "--kafka-broker", str(tmp_path / "broker"), "--kafka-client", str(client_file)
    )
    assert done.returncode == 0 and "written" in done.stdout, done.stderr
    secured = conf.load(client_file)
    scram_line = (tmp_path / "broker" / "scram-user.properties").read_text()
    assert scram_line == f"SCRAM-SHA-512=password={secured.password}\n"  # kafka-configs' file form
    assert oct(client_file.stat().st_mode & 0o777) == "0o600"
    pem = tmp_path / "broker" / "broker.pem"
    with SecureKafka(
        tmp_path / "kafka",
        mode="sasl_ssl",
        mechanisms=("SCRAM-SHA-512",),
        username=secured.username,
        password=secured.password,
        server_cert=(pem, pem),
    ) as kafka:
        client.check_reachable(
            kafka.bootstrap, conf=secured
        )  # raises on a refused certificate or login
    again, _ = _run_cli(
        "secrets", "--kafka-broker", str(tmp_path / "broker"), "--kafka-client", str(client_file)
    )
    assert "kept" in again.stdout and conf.load(client_file).password == secured.password
