"""Secured Kafka for tests, on loopback: Apache Kafka's own broker (KRaft, one JVM) with a
listener that requires SASL_SSL, SASL_PLAINTEXT, SSL or mutual TLS.

Everything is configured the way a Kafka operator does it, in the broker's properties:

* SCRAM-SHA-256 and SCRAM-SHA-512 users are made when the data folder is formatted, as
  ``kafka-storage format --add-scram`` makes them; PLAIN users are the listener's JAAS
  ``user_NAME="password"`` entries; ``sasl.enabled.mechanisms`` is what the listener offers.
* TLS presents a PEM key store (certificate and PKCS#8 key, from :mod:`kafka_pki`); mutual TLS
  is ``ssl.client.auth=required`` with the test CA as the trust store.
* ``session_lifetime_ms`` is ``connections.max.reauth.ms``: the broker grants that lifetime in
  SaslAuthenticate (KIP-368) and closes a connection that has not authenticated again by then.

The broker keeps its PLAINTEXT listener (``plain_bootstrap``: the same data, for the "TLS client
at a plaintext port" case and for throughput comparisons). ``more_certs`` adds listeners like
the secured one that present other certificates (a wrong name, an expired one), so the
refusals they cause come from the same JVM.

Before issue 54 no embedded broker could require SASL from a user one could create, so these
endpoints were stunnel4 in front of a self-written SASL relay in front of Tansu. Every case
that stand-in served (the eight refusals, SCRAM-SHA-256/512 and PLAIN logins, re-authentication
within the session lifetime, mutual TLS) is now Apache Kafka's own answer, so nothing here
still needs the relay and it is gone (``git log -- tests/ingest/secure_kafka.py``).

Example::

    with SecureKafka(tmp_path, mode="sasl_ssl") as kafka:
        Producer(kafka.confluent_conf(mechanism="SCRAM-SHA-512")).produce("t", b"v")
"""

from __future__ import annotations

import os
import re
import secrets
import ssl
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from pipeline.errors import BrokerError
from pipeline.ingest.kafka.broker import EmbeddedBroker, free_port
from tests.ingest.kafka_pki import Pki, ServerCert, make_pki, write_private

__all__ = ["MECHANISMS", "PROTOCOLS", "Pki", "SecureKafka", "ServerCert", "make_pki"]

#: Every SASL mechanism a SecureKafka can offer; it offers all of them by default.
MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
#: What each mode makes of the secured listener (Kafka's ``security.protocol``).
PROTOCOLS = {
    "sasl_ssl": "SASL_SSL",
    "sasl_plaintext": "SASL_PLAINTEXT",
    "ssl": "SSL",
    "mtls": "SSL",
}
Mode = Literal["sasl_ssl", "sasl_plaintext", "ssl", "mtls"]
#: The brokers a SecureKafka can be: Apache Kafka's own alone (see the module docstring).
ENGINES = ("kafka",)
#: What a user name or password may hold here: ``--add-scram`` values and JAAS lines are
#: written without escapes (generated passwords, ``secrets.token_urlsafe``, fit).
_PLAIN_TEXT = re.compile(r"[A-Za-z0-9_.~+-]+")
_JAAS_MODULE = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


class StartError(RuntimeError):
    """The secured broker did not come up; the message names its log."""


class SecureKafka:
    """Apache Kafka's broker with a secured listener on loopback, as a context manager.

    Args:
        folder: where certificates, configurations and the broker's log go (a test's
            ``tmp_path``).
        mode: ``sasl_ssl`` (TLS, then SASL), ``sasl_plaintext``, ``ssl`` (TLS, no client
            identity) or ``mtls`` (TLS requiring a client certificate signed by ``pki.ca``).
        mechanisms: the SASL mechanisms offered, among :data:`MECHANISMS`.
        username, password: the user created (default: generated, the password by
            :mod:`secrets`); ``users`` adds more (name -> password). Each is a SCRAM-SHA-256,
            a SCRAM-SHA-512 and a PLAIN user.
        session_lifetime_ms: ``connections.max.reauth.ms``: the broker closes a connection
            used after it without authenticating again. None: no limit.
        server_cert: which certificate the secured listener presents: ``good``, or for
            negative tests ``other_ca``, ``wrong_name``, ``expired``; or a (cert, key) pair
            of paths.
        more_certs: more listeners of the same mode, each presenting one of these
            certificates; ``bootstraps[which]`` is each one's host:port.
        engine: ``kafka`` (Apache Kafka's own broker; the only one).
        pki: certificates to reuse (default: :func:`make_pki` in ``folder/pki``).

    Attributes once started: ``bootstrap`` (the secured host:port), ``plain_bootstrap`` (the
    PLAINTEXT listener of the same broker), ``bootstraps`` (``more_certs``' listeners),
    ``protocol``, ``pids``, ``username``, ``password``, ``pki``, ``startup_s``.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        *,
        mode: Mode = "sasl_ssl",
        mechanisms: Iterable[str] = MECHANISMS,
        username: str | None = None,
        password: str | None = None,
        users: Mapping[str, str] | None = None,
        session_lifetime_ms: int | None = None,
        server_cert: ServerCert | tuple[str | os.PathLike[str], str | os.PathLike[str]] = "good",
        more_certs: Sequence[ServerCert] = (),
        engine: str = "kafka",
        pki: Pki | None = None,
    ) -> None:
        if mode not in PROTOCOLS:
            raise ValueError(f"mode {mode!r}: expected one of {', '.join(PROTOCOLS)}")
        if engine not in ENGINES:
            raise ValueError(
                f"engine {engine!r}: expected 'kafka'. The stunnel4 and SASL-relay stand-in "
                "in front of Tansu was removed once Apache Kafka's broker showed every case."
            )
        self.mechanisms = tuple(mechanisms)
        unknown = set(self.mechanisms) - set(MECHANISMS)
        if unknown or not self.mechanisms:
            raise ValueError(
                f"mechanisms {sorted(unknown)}: expected some of {', '.join(MECHANISMS)}"
            )
        if more_certs and mode == "sasl_plaintext":
            raise ValueError("more_certs: a sasl_plaintext listener presents no certificate")
        self.folder = Path(folder)
        self.mode = mode
        self.username = username or f"user-{secrets.token_hex(4)}"
        self.password = password or secrets.token_urlsafe(24)
        self.users = {self.username: self.password, **(users or {})}
        for text in [*self.users, *self.users.values()]:
            if not _PLAIN_TEXT.fullmatch(text):
                raise ValueError(
                    "Expected user names and passwords of letters, digits and -_.~+ (they are "
                    "written unescaped into --add-scram values and JAAS lines). Received one "
                    f"of {len(text)} characters with others."
                )
        self.session_lifetime_ms = session_lifetime_ms
        self.server_cert = server_cert
        self.more_certs = tuple(dict.fromkeys(more_certs))
        self.engine = engine
        self._pki = pki
        self._broker: EmbeddedBroker | None = None
        self.bootstrap = self.plain_bootstrap = ""
        self.bootstraps: dict[str, str] = {}
        self.startup_s = 0.0

    # --- what clients need

    @property
    def pki(self) -> Pki:
        if self._pki is None:
            self._pki = make_pki(self.folder / "pki")
        return self._pki

    @property
    def protocol(self) -> str:
        """Kafka's ``security.protocol`` for :attr:`bootstrap`."""
        return PROTOCOLS[self.mode]

    @property
    def sasl(self) -> bool:
        return self.mode.startswith("sasl")

    @property
    def tls(self) -> bool:
        return self.mode != "sasl_plaintext"

    @property
    def pids(self) -> dict[str, int]:
        """The running children by role: the broker's JVM."""
        broker = self._broker
        return {"broker": broker.pid} if broker is not None and broker.pid and broker.alive else {}

    def client_properties(
        self,
        *,
        mechanism: str | None = None,
        username: str | None = None,
        password: str | None = None,
        client_cert: bool | tuple[str | os.PathLike[str], str | os.PathLike[str]] | None = None,
        ca: str | os.PathLike[str] | None = None,
        verify_hostname: bool = True,
    ) -> dict[str, str]:
        """Client settings in Kafka's property names (librdkafka takes them as they are).

        ``client_cert``: True for ``pki.client_*``, False for none, or a (cert, key) pair;
        default: a certificate in ``mtls`` mode only. ``ca``: the CA file trusted (default
        ``pki.ca``). A wrong ``password``/``username`` makes a login fail, as tests want."""
        props = {"bootstrap.servers": self.bootstrap, "security.protocol": self.protocol}
        if self.sasl:
            props.update(
                {
                    "sasl.mechanism": mechanism or self.mechanisms[0],
                    "sasl.username": self.username if username is None else username,
                    "sasl.password": self.password if password is None else password,
                }
            )
        if self.tls:
            props["ssl.ca.location"] = str(ca or self.pki.ca)
            props["ssl.endpoint.identification.algorithm"] = "https" if verify_hostname else "none"
            pair = self._client_pair(client_cert)
            if pair:
                props["ssl.certificate.location"], props["ssl.key.location"] = map(str, pair)
        return props

    def _client_pair(
        self,
        client_cert: bool | tuple[str | os.PathLike[str], str | os.PathLike[str]] | None,
    ) -> tuple[str | os.PathLike[str], str | os.PathLike[str]] | None:
        if client_cert is None:
            client_cert = self.mode == "mtls"
        if client_cert is True:
            return self.pki.client_cert, self.pki.client_key
        return client_cert or None

    def write_client_properties(
        self, path: str | os.PathLike[str] | None = None, **settings: Any
    ) -> Path:
        """Write :meth:`client_properties` as a Java-style properties file (mode 0600: it
        holds a password) and return its path (default ``folder/client.properties``)."""
        target = Path(path) if path is not None else self.folder / "client.properties"
        lines = [
            f"{k}={_escape_property(v)}" for k, v in self.client_properties(**settings).items()
        ]
        write_private(target, ("\n".join(lines) + "\n").encode())
        return target

    def confluent_conf(self, **settings: Any) -> dict[str, Any]:
        """A confluent-kafka (librdkafka) configuration: :meth:`client_properties` (same
        keyword arguments), merged with ``extra={...}`` (any librdkafka property)."""
        extra = settings.pop("extra", None) or {}
        return {**self.client_properties(**settings), **extra}

    def kafka_python_kwargs(
        self,
        *,
        mechanism: str | None = None,
        username: str | None = None,
        password: str | None = None,
        client_cert: bool | tuple[str | os.PathLike[str], str | os.PathLike[str]] | None = None,
        ca: str | os.PathLike[str] | None = None,
        verify_hostname: bool = True,
    ) -> dict[str, Any]:
        """The same settings for kafka-python's KafkaProducer/KafkaConsumer/KafkaAdminClient."""
        kw: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "security_protocol": self.protocol,
        }
        if self.sasl:
            kw.update(
                sasl_mechanism=mechanism or self.mechanisms[0],
                sasl_plain_username=self.username if username is None else username,
                sasl_plain_password=self.password if password is None else password,
            )
        if self.tls:
            kw.update(ssl_cafile=str(ca or self.pki.ca), ssl_check_hostname=verify_hostname)
            pair = self._client_pair(client_cert)
            if pair:
                kw.update(ssl_certfile=str(pair[0]), ssl_keyfile=str(pair[1]))
        return kw

    def ssl_context(self, *, client_cert: bool | None = None) -> ssl.SSLContext:
        """A client SSLContext trusting ``pki.ca`` (kafka-python's ``ssl_context=``)."""
        ctx = ssl.create_default_context(cafile=str(self.pki.ca))
        pair = self._client_pair(client_cert)
        if pair:
            ctx.load_cert_chain(str(pair[0]), str(pair[1]))
        return ctx

    # --- the broker's configuration

    def _keystore(self, label: str, cert: ServerCert | tuple[Any, Any]) -> Path:
        """One PEM file with the certificate and its key: Kafka's PEM key store."""
        pair = self.pki.server_pair(cert) if isinstance(cert, str) else cert
        cert_pem, key_pem = (Path(p) for p in pair)
        data = cert_pem.read_bytes()
        if key_pem.resolve() != cert_pem.resolve():
            data = data.rstrip(b"\n") + b"\n" + key_pem.read_bytes()
        path = self.folder / f"keystore-{label.lower()}.pem"
        write_private(path, data)
        return path

    def _listener(self, label: str, cert: ServerCert | tuple[Any, Any]) -> dict[str, str]:
        """The settings of one secured listener, under ``listener.name.<label>.``."""
        at = f"listener.name.{label.lower()}."
        props: dict[str, str] = {}
        if self.tls:
            props[at + "ssl.keystore.type"] = "PEM"
            props[at + "ssl.keystore.location"] = str(self._keystore(label, cert))
        if self.mode == "mtls":
            props[at + "ssl.client.auth"] = "required"
            props[at + "ssl.truststore.type"] = "PEM"
            props[at + "ssl.truststore.location"] = str(self.pki.ca)
        if self.sasl:
            props[at + "sasl.enabled.mechanisms"] = ",".join(self.mechanisms)
            plain_users = " ".join(f'user_{u}="{p}"' for u, p in self.users.items())
            for mechanism in self.mechanisms:
                options = f" {plain_users}" if mechanism == "PLAIN" else ""
                props[at + f"{mechanism.lower()}.sasl.jaas.config"] = (
                    f"{_JAAS_MODULE[mechanism]} required{options};"
                )
        return props

    def _broker_properties(self, port: int, ports: Mapping[str, int]) -> dict[str, str]:
        """Listeners over the single-node defaults: PLAINTEXT on ``port``, then each of
        ``ports`` (label -> port; the first is the secured listener, named by its protocol)."""
        controller = free_port()
        certs = [self.server_cert, *self.more_certs]
        listeners = [f"{label}://127.0.0.1:{p}" for label, p in ports.items()]
        props = {
            "listeners": ",".join(
                [
                    f"PLAINTEXT://127.0.0.1:{port}",
                    *listeners,
                    f"CONTROLLER://127.0.0.1:{controller}",
                ]
            ),
            "advertised.listeners": ",".join([f"PLAINTEXT://127.0.0.1:{port}", *listeners]),
            "controller.quorum.voters": f"1@127.0.0.1:{controller}",
            "listener.security.protocol.map": ",".join(
                ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
                + [f"{label}:{self.protocol}" for label in ports]
            ),
        }
        for label, cert in zip(ports, certs, strict=True):
            props.update(self._listener(label, cert))
        if self.session_lifetime_ms is not None:
            props["connections.max.reauth.ms"] = str(self.session_lifetime_ms)
        return props

    # --- lifecycle

    def start(self, timeout_s: float = 120.0) -> SecureKafka:
        """Start the broker; return when it answers on its PLAINTEXT listener (Kafka opens
        every listener at once). Raises :class:`StartError`."""
        if self._broker is not None:
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.tls:
            _ = self.pki  # certificates first: they are not timed as startup
        began = time.monotonic()
        scram = tuple(
            f"{mechanism}=[name={user},password={password}]"
            for user, password in self.users.items()
            for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512")
        )
        labels = [self.protocol, *(which.upper() for which in self.more_certs)]
        # A port probed free can be taken before the JVM binds it: a new try takes new ones.
        for _ in range(3):
            port, ports = free_port(), {label: free_port() for label in labels}
            broker = EmbeddedBroker(
                engine="kafka",
                port=port,
                log_path=self.folder / "broker.log",
                properties=self._broker_properties(port, ports),
                scram=scram,
            )
            try:
                self._broker = broker.start(timeout_s)
                break
            except BrokerError:
                broker.stop()
        else:
            raise StartError(f"Apache Kafka did not start; its log: {self.folder / 'broker.log'}")
        self.plain_bootstrap = self._broker.bootstrap
        self.bootstrap = f"127.0.0.1:{ports[self.protocol]}"
        self.bootstraps = {which: f"127.0.0.1:{ports[which.upper()]}" for which in self.more_certs}
        self.startup_s = time.monotonic() - began
        return self

    def stop(self) -> None:
        """Stop the broker, by pid."""
        broker, self._broker = self._broker, None
        if broker is not None:
            broker.stop()

    def __enter__(self) -> SecureKafka:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _escape_property(value: str) -> str:
    """A value as a Java properties file reads it back (backslash escapes)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("=", "\\=").replace(":", "\\:")
